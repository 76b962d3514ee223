// The lifecycle of real boxes against a model, docker driver (a real engine; skipped with the reason
// printed when none answers): see property-lifecycle-suite.ts.
import { lifecycleSuite } from './property-lifecycle-suite.js';

await lifecycleSuite('docker');
