/**
 * The `none` driver: today's behaviour, a record plus a proxy, for boxes that run elsewhere (the
 * operator's own containers point their HTTPS_PROXY at the box's proxy). Nothing runs here, so
 * nothing is isolated here: executions and files are refused with a message that says so, and the
 * API says `driver: none` on every such box (sandbox.md, "Drivers").
 */
import { rmSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { BoxFileError, type Box, type BoxSpec, type DriverProbe, type ExecProcess, type SandboxDriver } from './driver.js';

const ELSEWHERE = 'this box runs elsewhere (driver "none"): keygate only holds its record and its proxy; run code and files in your own container, or start keygate with a real driver (--sandbox-driver local or docker)';

class RecordOnlyBox implements Box {
  constructor(readonly id: string) {}

  async exec(): Promise<ExecProcess> {
    throw new Error(ELSEWHERE);
  }

  async readFile(): Promise<{ size: number; stream: Readable }> {
    throw new BoxFileError('not_running', ELSEWHERE);
  }

  async writeFile(body: unknown): Promise<{ size: number }> {
    void body;
    throw new BoxFileError('not_running', ELSEWHERE);
  }

  async stop(): Promise<void> {}

  /** Nothing runs here that could end. */
  readonly ended = new Promise<void>(() => undefined);
}

export class NoneDriver implements SandboxDriver {
  readonly name = 'none' as const;

  async probe(): Promise<DriverProbe> {
    return { ok: true, detail: 'no isolation: boxes are records with a proxy, for code that runs elsewhere' };
  }

  async start(spec: BoxSpec): Promise<Box> {
    return new RecordOnlyBox(spec.id);
  }

  async destroy(_id: string, stateDir: string): Promise<void> {
    rmSync(stateDir, { recursive: true, force: true });
  }

  async reapOrphans(): Promise<void> {}

  async close(): Promise<void> {}
}
