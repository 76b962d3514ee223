/**
 * An expected command failure: printed as one line, no stack trace, and the process exits with
 * `exitCode` (1 a failure, 2 a usage error). Thrown by the command-line tools and by the libraries
 * they drive (src/deploy), which therefore do not depend on src/cli.
 */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
    this.name = 'CliError';
  }
}
