// The files API and execution against real boxes of the local driver (bubblewrap): see property-files-suite.ts.
import { filesSuite } from './property-files-suite.js';

await filesSuite('local');
