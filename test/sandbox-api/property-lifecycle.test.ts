// The lifecycle of real boxes against a model, local driver (bubblewrap): see property-lifecycle-suite.ts.
import { lifecycleSuite } from './property-lifecycle-suite.js';

await lifecycleSuite('local');
