// The files API and execution against real boxes of the docker driver (a real engine; skipped with
// the reason printed when none answers): see property-files-suite.ts.
import { filesSuite } from './property-files-suite.js';

await filesSuite('docker');
