import type { Logger } from '../log.js';
import type { Envelope } from '../secrets/envelope.js';
import type { Db } from '../store/db.js';

/** What every area of `keygate serve` shares: storage, the encryption envelope, logging, settings. */
export interface ServerContext {
  db: Db;
  dataDir: string;
  /** The current keyring's envelope (re-read on access, so key rotation applies immediately). */
  readonly envelope: Envelope;
  logger: Logger;
  /** The address clients use to reach this server (e.g. `http://127.0.0.1:8080`), once listening. */
  publicUrl(): string;
  /** Directory of the shipped/operator configuration (templates.json, providers ...). */
  configDir: string;
  env: NodeJS.ProcessEnv;
}
