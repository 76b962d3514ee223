/**
 * Which driver a server uses (sandbox.md, "Choosing"): the one asked for, or refuse to start when it
 * cannot isolate; otherwise `local` if it works here, else `docker` if an engine answers, else `none`,
 * saying why and how to get a real one. Never pretends a `none` box is isolated.
 */
import type { DriverName, SandboxDriver } from './driver.js';

export interface DriverChoice {
  driver: SandboxDriver;
  /** One line for the start-up output: which driver and why. */
  why: string;
}

/** Thrown when the driver asked for cannot be used: `keygate serve` refuses to start with this message. */
export class DriverUnusableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DriverUnusableError';
  }
}

export async function chooseDriver(
  requested: DriverName | undefined,
  candidates: Partial<Record<DriverName, () => SandboxDriver | Promise<SandboxDriver>>>,
): Promise<DriverChoice> {
  if (requested) {
    const make = candidates[requested];
    if (!make) throw new DriverUnusableError(`sandbox driver "${requested}" is not available in this build`);
    const driver = await make();
    const p = await driver.probe();
    if (!p.ok) throw new DriverUnusableError(`sandbox driver "${requested}" cannot isolate boxes here: ${p.reason} (${p.hint})`);
    return { driver, why: `sandbox driver ${requested} (asked for): ${p.detail}` };
  }
  const missing: string[] = [];
  for (const name of ['local', 'docker'] as const) {
    const make = candidates[name];
    if (!make) continue;
    const driver = await make();
    const p = await driver.probe();
    if (p.ok) return { driver, why: `sandbox driver ${name}: ${p.detail}` };
    missing.push(`${name}: ${p.reason} (${p.hint})`);
  }
  const none = candidates.none;
  if (!none) throw new DriverUnusableError(`no sandbox driver can isolate boxes here; ${missing.join('; ')}`);
  return {
    driver: await none(),
    why: `sandbox driver none: boxes are NOT isolated and run no code here (records and proxies only). To get real boxes: ${missing.join('; ') || 'no isolating driver is built in'}`,
  };
}
