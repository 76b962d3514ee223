import { CliError } from './errors.js';

// Placeholder until this command lands; replaced by its implementation.
export async function run(_argv: string[]): Promise<number> {
  throw new CliError("'keygate app' is not available yet");
}
