// The Dockerfile and docker-compose.yml checked without an engine (fast, on every machine): the
// security invariants of the compose topology, that every keygate command and flag they use
// exists, and that the proxy really starts with the compose config. On a real engine: image.test.ts
// and compose.test.ts.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { REPO_ROOT, runCli, startCli } from '../helpers/cli.js';

type Service = { command?: string[] | string; networks?: string[]; volumes?: string[]; image?: string; build?: string; user?: string; entrypoint?: string[] };
type Compose = { services: Record<string, Service>; networks: Record<string, { internal?: boolean } | null>; volumes: Record<string, unknown> };

const compose: Compose = JSON.parse(
  execFileSync('/usr/bin/python3', ['-c', 'import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))', path.join(REPO_ROOT, 'docker-compose.yml')], { encoding: 'utf8' }),
);
const dockerfile = readFileSync(path.join(REPO_ROOT, 'Dockerfile'), 'utf8');
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

function flagsOf(args: string[]): string[] {
  return args.filter((a) => a.startsWith('--')).map((a) => a.split('=')[0]);
}

describe('docker-compose.yml', () => {
  const { sandbox, 'keygate-proxy': proxy, 'ca-init': caInit } = compose.services;

  it('gives the sandbox no route out except the sidecar', () => {
    expect(sandbox.networks).toEqual(['sandbox']);
    expect(compose.networks.sandbox?.internal).toBe(true);
    const onSandboxNet = Object.entries(compose.services).filter(([, s]) => s.networks?.includes('sandbox')).map(([n]) => n);
    expect(onSandboxNet.sort()).toEqual(['keygate-proxy', 'sandbox']);
    expect(proxy.networks).toContain('egress');
    expect(compose.networks.egress?.internal).not.toBe(true);
  });

  it('never mounts the CA private key or the secrets into the sandbox', () => {
    const mounts = (sandbox.volumes ?? []).map((v) => v.split(':')[0]);
    expect(mounts).not.toContain('ca-private');
    expect(mounts.some((m) => m.includes('secrets'))).toBe(false);
    expect(mounts).toEqual(['ca-public']);
    expect((sandbox.volumes ?? [])[0]).toMatch(/:ro$/);
  });

  it('points the sandbox at the sidecar with the trust variables that replace the store', () => {
    const env = (sandbox as unknown as { environment: Record<string, string> }).environment;
    for (const k of ['HTTPS_PROXY', 'HTTP_PROXY', 'https_proxy', 'http_proxy']) expect(env[k]).toBe('http://keygate-proxy:3128');
    for (const k of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO']) expect(env[k]).toBe('/ca/bundle.pem');
    expect(env.NODE_EXTRA_CA_CERTS).toBe('/ca/ca.pem');
  });

  it('uses only flags that keygate proxy and keygate ca accept', () => {
    const proxyHelp = runCli(['proxy', '--help']).stdout;
    const args = proxy.command as string[];
    expect(args[0]).toBe('proxy');
    for (const f of flagsOf(args)) expect(proxyHelp, `keygate proxy ${f}`).toContain(f);
    const caHelp = runCli(['ca', '--help']).stdout;
    const script = (caInit.command as string[]).join(' ');
    const caFlags = [...script.matchAll(/--[a-z-]+/g)].map((m) => m[0]);
    expect(caFlags.length).toBeGreaterThan(3);
    for (const f of caFlags) expect(caHelp, `keygate ca ${f}`).toContain(f);
  });

  it('starts the proxy with the compose config and a Kubernetes-style secrets directory', async () => {
    const tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-compose-'));
    dirs.push(tmp);
    const secrets = path.join(tmp, 'secrets');
    mkdirSync(secrets);
    writeFileSync(path.join(secrets, 'GITHUB_TOKEN'), 'compose-test-token\n');
    const args = (proxy.command as string[]).slice(1).map((a) =>
      a
        .replace('--config=/config/proxy.json', `--config=${path.join(REPO_ROOT, 'config/compose/proxy.json')}`)
        .replace('--listen=0.0.0.0:3128', '--listen=127.0.0.1:0')
        .replace('--certs=/certs', `--certs=${path.join(tmp, 'certs')}`)
        .replace('--secrets-dir=/run/keygate-secrets', `--secrets-dir=${secrets}`),
    );
    const running = await startCli(['proxy', ...args, '--data', path.join(tmp, 'data')]);
    try {
      expect(running.output()).toMatch(/listening on 127\.0\.0\.1:\d+/);
      expect(running.output()).not.toContain('compose-test-token');
    } finally {
      expect(await running.stop()).toBe(0);
    }
  });
});

describe('Dockerfile', () => {
  it('is multi-stage, runs as a non-root user and starts the compiled CLI', () => {
    expect(dockerfile.match(/^FROM /gm)?.length).toBe(2);
    // Node 24, a public name that builds anywhere; overridable (scripts/build-images.sh tags it locally).
    expect(dockerfile).toMatch(/^ARG NODE_IMAGE=node:24-bookworm-slim$/m);
    expect(dockerfile.match(/^FROM \$\{NODE_IMAGE\}( AS build)?$/gm)).toEqual(['FROM ${NODE_IMAGE} AS build', 'FROM ${NODE_IMAGE}']);
    expect(dockerfile).toMatch(/^USER node$/m);
    expect(dockerfile).toContain('ENTRYPOINT ["node", "--max-semi-space-size=2", "--heap-growing-percent=20", "/app/dist/cli/main.js"]');
    // npm run build (in the image too) generates the standalone config validator with this script.
    expect(dockerfile).toMatch(/^COPY scripts\/build-validators\.mjs \.\/scripts\/$/m);
    // The benchmark runs keygate with the image's node flags: the figures are the shipped ones.
    const benchFlags = /IMAGE_NODE_FLAGS = (\[[^\]]*\])/.exec(readFileSync(path.join(REPO_ROOT, 'bench/lib/peers.mjs'), 'utf8'))?.[1];
    expect(JSON.parse((benchFlags ?? '').replace(/'/g, '"'))).toEqual(['--max-semi-space-size=2', '--heap-growing-percent=20']);
    expect(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')).toContain('"start": "node --max-semi-space-size=2 --heap-growing-percent=20 dist/cli/main.js start"');
    expect(dockerfile).toMatch(/^STOPSIGNAL SIGTERM$/m);
    // The build installs with scripts off, so the native addon must be rebuilt explicitly.
    expect(dockerfile).toContain('npm rebuild better-sqlite3');
    expect(dockerfile).toContain('npm prune --omit=dev');
  });

  it('copies every directory the runtime reads', () => {
    for (const dir of ['dist', 'config', 'examples', 'node_modules']) expect(dockerfile).toMatch(new RegExp(`COPY .*\\b${dir}\\b`));
    const cmd = /^CMD (\[.*\])$/m.exec(dockerfile);
    const args: string[] = JSON.parse(cmd![1]);
    expect(args[0]).toBe('serve');
    const help = runCli(['serve', '--help']).stdout;
    for (const f of flagsOf(args)) expect(help).toContain(f);
  });
});
