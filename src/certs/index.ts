export { ensureCa, loadCa, CaError, CA_CERT_FILE, CA_KEY_FILE, type Ca } from './ca.js';
export { LeafMinter, type LeafMinterOptions } from './leaf.js';
export { sandboxEnv, writeCaBundle, caBundle, type SandboxEnvOptions } from './env.js';
