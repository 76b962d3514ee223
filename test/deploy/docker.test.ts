// Image builds for `keygate deploy --build-image`: tag parsing, the build context check, and the
// docker runs themselves against a stand-in docker CLI (a real process that records its arguments).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CliError } from '../../src/cli/errors.js';
import { buildArgs, buildImage, checkBuildContext, checkContainerRuntime, dockerEnv, localImagePlatform, pushImage, runDocker } from '../../src/deploy/docker.js';
import { DockerIgnore } from '../../src/deploy/dockerignore.js';
import { parseImageTag } from '../../src/deploy/image-ref.js';
import { announceSkip, engineUnavailableReason } from '../helpers/docker-engine.js';
import { DEBIAN_IMAGE, docker, ensureBaseImages, uniqueName } from '../helpers/docker-images.js';
import { fakeDocker } from './helpers.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'keygate-docker-unit-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('image tags', () => {
  it.each([
    ['app', null, 'app', null],
    ['app:dev', null, 'app', 'dev'],
    ['team/app:1.2', null, 'team/app', '1.2'],
    ['registry.example.com/team/app:1', 'registry.example.com', 'team/app', '1'],
    ['localhost:5000/app', 'localhost:5000', 'app', null],
    ['localhost/app:x', 'localhost', 'app', 'x'],
    ['Registry/app', 'Registry', 'app', null],
    ['ghcr.io/me/my_app__x-y.z:v1_2-3', 'ghcr.io', 'me/my_app__x-y.z', 'v1_2-3'],
    ['docker.io/me/app', 'docker.io', 'me/app', null],
  ])('%s -> registry %s, repository %s, tag %s', (raw, registry, repository, tag) => {
    expect(parseImageTag(raw)).toEqual({ registry, repository, tag });
  });

  it.each([
    ['', /empty/],
    ['-t', /starts with '-'/],
    ['--platform=linux/arm64', /starts with '-'/],
    ['app name', /white space/],
    ['app@sha256:abcd', /not a digest/],
    ['App', /'App' is not a valid repository name component/],
    ['team/App:1', /'App'/],
    ['app:', /the tag ''/],
    ['app:-x', /the tag '-x'/],
    ['app:' + 'x'.repeat(129), /up to 128/],
    ['reg.io/', /repository name is missing/],
    ['a..b/app', /'a\.\.b' is not a registry host/],
    ['app_/x', /'app_'/],
  ])('%j is refused', (raw, why) => {
    const r = parseImageTag(raw);
    expect(typeof r).toBe('string');
    expect(r).toMatch(why);
  });
});

describe('the build context', () => {
  it('needs a Dockerfile in DIR', () => {
    const d = tmp();
    expect(() => checkBuildContext(d)).toThrow(CliError);
    expect(() => checkBuildContext(d)).toThrow(`${path.join(d, 'Dockerfile')} not found: --build-image builds the Dockerfile in DIR`);
    expect(() => checkBuildContext(path.join(d, 'nope'))).toThrow(/does not exist or is not a directory/);
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\n');
    expect(checkBuildContext(d)).toEqual({ dockerfile: path.join(d, 'Dockerfile') });
  });

  it('refuses to send a local .env to docker unless .dockerignore excludes it', () => {
    const d = tmp();
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\nCOPY . .\n');
    writeFileSync(path.join(d, '.env'), 'KEYGATE_API_KEY=kg_secret_value\n');
    writeFileSync(path.join(d, '.env.local'), 'X=1\n');
    writeFileSync(path.join(d, 'environment.md'), 'not an env file\n');
    let msg = '';
    try {
      checkBuildContext(d);
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg).toBe(`refusing to build: .env, .env.local would be sent to docker with the build context (and could be copied into the image); add '.env*' to ${path.join(d, '.dockerignore')}`);
    expect(msg).not.toContain('kg_secret_value');
    writeFileSync(path.join(d, '.dockerignore'), '.env\n');
    expect(() => checkBuildContext(d)).toThrow(/refusing to build: \.env\.local would be sent/);
    writeFileSync(path.join(d, '.dockerignore'), 'node_modules\n.env*\n');
    expect(checkBuildContext(d).dockerfile).toBe(path.join(d, 'Dockerfile'));
    // A later negation brings it back into the context: refused again.
    writeFileSync(path.join(d, '.dockerignore'), '.env*\n!.env\n');
    expect(() => checkBuildContext(d)).toThrow(/refusing to build: \.env would be sent/);
  });
});

describe('the build context: secret-bearing files at any depth', () => {
  const refusal = (d: string): string => {
    try {
      checkBuildContext(d);
      return '';
    } catch (e) {
      return (e as Error).message;
    }
  };

  it('refuses a nested .env or .env.* (the packer never packs them at any depth) unless .dockerignore excludes it the way docker reads it', () => {
    const d = tmp();
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\nCOPY . .\n');
    mkdirSync(path.join(d, 'config'));
    mkdirSync(path.join(d, 'packages/api'), { recursive: true });
    writeFileSync(path.join(d, 'config/.env'), 'OPENAI_API_KEY=sk-nested-secret\n');
    writeFileSync(path.join(d, 'packages/api/.env.production'), 'X=1\n');
    writeFileSync(path.join(d, 'packages/api/env.ts'), 'export {};\n');
    const msg = refusal(d);
    expect(msg).toBe(`refusing to build: config/.env, packages/api/.env.production would be sent to docker with the build context (and could be copied into the image); add '**/.env*' to ${path.join(d, '.dockerignore')}`);
    expect(msg).not.toContain('sk-nested-secret');
    // docker anchors a pattern at the context root: '.env*' does not reach config/.env.
    writeFileSync(path.join(d, '.dockerignore'), '.env*\n');
    expect(refusal(d)).toMatch(/^refusing to build: config\/\.env, packages\/api\/\.env\.production would be sent/);
    writeFileSync(path.join(d, '.dockerignore'), '**/.env*\n');
    expect(refusal(d)).toBe('');
    // An excluded directory takes its files along; a negation brings one back.
    writeFileSync(path.join(d, '.dockerignore'), 'config\npackages/*/.env*\n');
    expect(refusal(d)).toBe('');
    writeFileSync(path.join(d, '.dockerignore'), 'config\n**/.env*\n!packages/api/.env.production\n');
    expect(refusal(d)).toMatch(/^refusing to build: packages\/api\/\.env\.production would be sent/);
  });

  it("refuses the env file keygate.json names, wherever it is and whatever its name, as plain deploy never packs it", () => {
    const d = tmp();
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\nCOPY . .\n');
    mkdirSync(path.join(d, 'secrets'));
    writeFileSync(path.join(d, 'secrets/app.vars'), 'TOKEN=abc\n');
    writeFileSync(path.join(d, 'keygate.json'), JSON.stringify({ assistants: { a: './a.js' }, env: './secrets/app.vars' }));
    expect(refusal(d)).toMatch(/^refusing to build: secrets\/app\.vars would be sent to docker with the build context/);
    writeFileSync(path.join(d, '.dockerignore'), 'secrets/\n');
    expect(refusal(d)).toBe('');
  });

  it('does not walk node_modules or .git (never packed) and leaves files that only look alike', () => {
    const d = tmp();
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\n');
    mkdirSync(path.join(d, 'node_modules/pkg'), { recursive: true });
    writeFileSync(path.join(d, 'node_modules/pkg/.env'), 'X=1\n');
    mkdirSync(path.join(d, 'src'));
    writeFileSync(path.join(d, 'src/.envrc.md'), 'docs\n');
    writeFileSync(path.join(d, 'src/environment.ts'), 'x\n');
    expect(refusal(d)).toBe('');
  });
});

describe('docker build and push', () => {
  it('cross-builds for linux/amd64 on arm64 and arm hosts, natively on amd64', async () => {
    for (const [arch, want] of [
      ['arm64', ['build', '--force-rm', '--platform', 'linux/amd64', '-t', 'reg.io/app:1', '/ctx']],
      ['arm', ['build', '--force-rm', '--platform', 'linux/amd64', '-t', 'reg.io/app:1', '/ctx']],
      ['x64', ['build', '--force-rm', '-t', 'reg.io/app:1', '/ctx']],
    ] as const) {
      expect(buildArgs('reg.io/app:1', '/ctx', arch)).toEqual(want);
    }
    expect(buildArgs('app', '/ctx')).toEqual(['build', '--force-rm', ...(process.arch === 'arm64' || process.arch === 'arm' ? ['--platform', 'linux/amd64'] : []), '-t', 'app', '/ctx']);

    // The same through a real docker process: the arguments it received, per host architecture.
    const d = tmp();
    const fake = fakeDocker(d);
    const lines: string[] = [];
    await buildImage({ tag: 'reg.io/team/app:1', dir: d, arch: 'arm64', docker: fake.bin, onLine: (l, s) => lines.push(`${s}: ${l}`) });
    await buildImage({ tag: 'reg.io/team/app:1', dir: d, arch: 'x64', docker: fake.bin, onLine: () => undefined });
    expect(fake.calls().map((c) => c.args)).toEqual([
      ['build', '--force-rm', '--platform', 'linux/amd64', '-t', 'reg.io/team/app:1', d],
      ['build', '--force-rm', '-t', 'reg.io/team/app:1', d],
    ]);
    expect(lines).toContain(`stdout: build step 1/2 for ${d}`);
    expect(lines).toContain('stderr: build progress on stderr');
    expect(lines).toContain('stdout: build step 2/2 done');
  });

  it('a failing build or push is one line naming the exit status; the API key never reaches docker', async () => {
    const d = tmp();
    const fake = fakeDocker(d);
    const env = { ...dockerEnv({ ...process.env, KEYGATE_API_KEY: 'kg_never_to_docker', KEYGATE_URL: 'http://x' }), FAKE_DOCKER_FAIL: 'build' };
    expect((env as NodeJS.ProcessEnv).KEYGATE_API_KEY).toBeUndefined();
    const seen: string[] = [];
    const err = await buildImage({ tag: 'app:1', dir: d, arch: 'x64', docker: fake.bin, env, onLine: (l) => seen.push(l) }).catch((e) => e);
    expect(err).toBeInstanceOf(CliError);
    expect(err.message).toBe('the image build failed: docker build exited with status 3 (its output is above)');
    expect(seen).toContain('build: something broke');

    const perr = await pushImage({ tag: 'reg.io/app:1', registry: 'reg.io', docker: fake.bin, env: { ...env, FAKE_DOCKER_FAIL: 'push' }, onLine: () => undefined }).catch((e) => e);
    expect(perr.message).toBe('pushing reg.io/app:1 failed: docker push exited with status 3 (its output is above; are you logged in? docker login reg.io)');
    await pushImage({ tag: 'reg.io/app:1', registry: 'reg.io', docker: fake.bin, env, onLine: () => undefined });
    expect(fake.calls().map((c) => c.args)).toEqual([
      ['build', '--force-rm', '-t', 'app:1', d],
      ['push', 'reg.io/app:1'],
      ['push', 'reg.io/app:1'],
    ]);
    expect(fake.calls().every((c) => !c.apiKeyInEnv)).toBe(true);

    const missing = await runDocker(['info'], { docker: path.join(d, 'no-such-docker'), onLine: () => undefined }).catch((e) => e);
    expect(missing.message).toBe(`no container runtime: '${path.join(d, 'no-such-docker')}' was not found`);
  });

  it('streams line by line, joining chunks and cutting overlong lines', async () => {
    const d = tmp();
    const bin = path.join(d, 'chunky');
    // Writes a line in pieces, a CRLF line, overlong lines (in one chunk and across chunks), and a
    // last line without a newline.
    writeFileSync(
      bin,
      `#!${process.execPath}
const w = (s) => new Promise((r) => process.stdout.write(s, () => setTimeout(r, 20)));
(async () => { await w('hel'); await w('lo\\nwin\\r\\n'); await w('x'.repeat(40000) + '\\n'); for (let i = 0; i < 3; i++) await w('y'.repeat(10000)); await w('yy\\nz\\n'); await w('tail'); })();
`,
      { mode: 0o755 },
    );
    const lines: string[] = [];
    const r = await runDocker([], { docker: bin, onLine: (l) => lines.push(l) });
    expect(r).toEqual({ code: 0, signal: null });
    expect(lines.map((l) => (l.length > 100 ? `${l.slice(0, 3)}...${l.slice(-12)} (${l.length})` : l))).toEqual([
      'hello',
      'win',
      `xxx...x [line cut] (${16 * 1024 + ' [line cut]'.length})`,
      `yyy...y [line cut] (${16 * 1024 + ' [line cut]'.length})`,
      'z',
      'tail',
    ]);
  });
});

// The same functions against the real engine: what the stand-in above cannot tell (that docker
// really accepts these arguments, streams its build, and reports the platform deploy checks).
const noEngine = announceSkip('the image build tests on a real engine', await engineUnavailableReason());

describe.skipIf(noEngine)('docker build on a real engine', () => {
  const tag = `${uniqueName('deploy')}:1`;
  beforeAll(() => ensureBaseImages(), 30 * 60_000);
  afterAll(() => {
    docker(['image', 'rm', '-f', tag], { allowFail: true });
  });

  it('finds the runtime, builds a Dockerfile streaming its output, and reports the image linux/amd64', async () => {
    expect(checkContainerRuntime()).toMatch(/^\d+\.\d+/);
    const d = tmp();
    // A step of its own each run: a cached step prints nothing, and the engine keeps its build
    // cache from an earlier run (CI runs this file once per Node version on the same engine).
    writeFileSync(path.join(d, 'Dockerfile'), `FROM ${DEBIAN_IMAGE}\nRUN echo built-marker-$((6*7)) ${uniqueName('run')}\n`);
    const lines: string[] = [];
    await buildImage({ tag, dir: d, onLine: (l) => lines.push(l) });
    expect(lines.some((l) => l.includes('built-marker-42'))).toBe(true);
    expect(localImagePlatform(tag)).toBe('linux/amd64');
    expect(localImagePlatform(`${uniqueName('absent')}:never`)).toBeUndefined();
  });

  it("reads .dockerignore as docker does: the files docker sends are exactly those the matcher keeps", async () => {
    const d = tmp();
    const files = ['.env', 'config/.env', 'config/app.json', 'packages/api/.env.production', 'packages/web/.env', 'a/b/.env.x', 'a/keep.txt', 'keep', 'sub/.env.local'];
    for (const f of files) {
      mkdirSync(path.dirname(path.join(d, f)), { recursive: true });
      writeFileSync(path.join(d, f), 'x\n');
    }
    const rules = '# comment\n.env*\nconfig\n**/.env.x\n!config/.env\npackages/*/.env*\n!packages/web/.env\n/sub/../sub/.env.local\n';
    writeFileSync(path.join(d, '.dockerignore'), rules);
    writeFileSync(path.join(d, 'Dockerfile'), 'FROM scratch\nCOPY . /ctx/\n');
    await buildImage({ tag, dir: d, onLine: () => undefined });
    // The image's files, read without running it (scratch has nothing to run).
    const id = docker(['create', tag, '/none']).stdout.trim();
    let listed: string;
    try {
      listed = docker(['export', id], { timeoutMs: 60_000 }).stdout;
    } finally {
      docker(['rm', '-f', id], { allowFail: true });
    }
    const ig = new DockerIgnore(rules);
    for (const f of files) expect([f, listed.includes(`ctx/${f}\0`)]).toEqual([f, !ig.ignores(f)]);
  });

  it('a Dockerfile step that fails is one line naming the exit status', async () => {
    const d = tmp();
    const marker = uniqueName('failing-step');
    writeFileSync(path.join(d, 'Dockerfile'), `FROM ${DEBIAN_IMAGE}\nRUN echo ${marker}; exit 3\n`);
    const lines: string[] = [];
    await expect(buildImage({ tag, dir: d, onLine: (l) => lines.push(l) })).rejects.toThrow('the image build failed: docker build exited with status 3 (its output is above)');
    expect(lines.join('\n')).toMatch(/returned a non-zero code: 3/);
    // The failed step's container is not left behind (one per failed deploy otherwise).
    const left = docker(['ps', '-a', '--no-trunc', '--format', '{{.Command}}']).stdout;
    expect(left).not.toContain(marker);
  });
});
