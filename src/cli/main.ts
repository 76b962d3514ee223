#!/usr/bin/env -S node --max-semi-space-size=2 --heap-growing-percent=20
// (The flags above are SERVER_NODE_FLAGS in v8-flags.ts, kept equal by test/cli/v8-flags.test.ts.)
// The `keygate` binary: picks the sub-command and hands it the remaining arguments.
// Each command lives in its own module and is imported lazily, so `keygate proxy` never loads
// the database driver and `keygate deploy` never loads the TLS interception code.

import { loggableStack } from '../server/errors.js';
import { CliError } from './errors.js';
import { ensureServerFlags, holdOptimizer, leanServerFlags } from './v8-flags.js';
import { startIdleGc } from '../proxy/idle-gc.js';

type CommandModule = { run(argv: string[]): Promise<number | void> };

const commands: Record<string, { summary: string; load: () => Promise<CommandModule> }> = {
  start: { summary: 'start the whole stack on embedded defaults (quick start)', load: () => import('./start.js') },
  proxy: { summary: 'run the auth proxy sidecar', load: () => import('./proxy.js') },
  ca: { summary: 'create the CA, print the environment a sandbox needs', load: () => import('./ca.js') },
  secrets: { summary: 'manage workspace secrets in the local store', load: () => import('./secrets.js') },
  serve: { summary: 'run the sandbox API, control plane and auth service', load: () => import('./serve.js') },
  app: { summary: 'serve an application (POST /runs/stream)', load: () => import('./app.js') },
  deploy: { summary: 'deploy an application and manage deployments', load: () => import('./deploy.js') },
  sandbox: { summary: 'create boxes, run commands and copy files in them (sandbox API)', load: () => import('./sandbox.js') },
};

/** Commands that run servers with upstream connections (see v8-flags.ts). */
const SERVERS = new Set(['proxy', 'serve', 'start']);

function usage(): string {
  const width = Math.max(...Object.keys(commands).map((c) => c.length));
  const lines = Object.entries(commands).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`);
  return `usage: keygate <command> [options]\n\ncommands:\n${lines.join('\n')}\n\nRun 'keygate <command> --help' for a command's options.`;
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(usage() + '\n');
    return name ? 0 : 2;
  }
  if (name === '--version' || name === '-v') {
    const { version } = await import('../version.js');
    process.stdout.write(version + '\n');
    return 0;
  }
  const command = commands[name];
  if (!command) {
    process.stderr.write(`keygate: unknown command '${name}'\n\n${usage()}\n`);
    return 2;
  }
  if (SERVERS.has(name)) {
    // Does not return when the process re-executes itself with the heap flags (and, for the
    // sidecar, the allocator setting).
    ensureServerFlags(process.env, { sidecar: name === 'proxy' });
    leanServerFlags();
    holdOptimizer();
    startIdleGc();
  }
  const mod = await command.load();
  const code = await mod.run(rest);
  return typeof code === 'number' ? code : 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    // Long-running commands (servers) resolve only when they stop, so exiting here is safe.
    process.exitCode = code;
  },
  (err: unknown) => {
    // Expected failures are one line; anything else is a bug and keeps its stack. Our messages
    // carry no secret value; Node's argument checks quote what they refused, which is dropped.
    if (err instanceof CliError) {
      process.stderr.write(`keygate: ${err.message}\n`);
      process.exitCode = err.exitCode;
    } else {
      process.stderr.write(`keygate: unexpected error: ${err instanceof Error ? loggableStack(err) : String(err)}\n`);
      process.exitCode = 1;
    }
  },
);
