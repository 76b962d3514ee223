// The class lives outside src/cli so that the libraries the CLI drives can throw it too.
export { CliError } from '../command-error.js';
