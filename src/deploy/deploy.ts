import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { CliError } from '../command-error.js';
import { RESERVED_SECRET_NAME } from '../control-plane/types.js';
import { isSecretKey } from '../secrets/keys.js';
import { checkAppDir } from './appdir.js';
import { ApiError, ControlPlaneClient, type Deployment, type Revision, type Secret } from './client.js';
import { buildImage, checkBuildContext, checkContainerRuntime, dockerEnv, localImagePlatform, pushImage, suggestedBuildCommand, TARGET_PLATFORM } from './docker.js';
import { parseImageTag, type ImageRef } from './image-ref.js';
import { formatBytes, formatElapsed } from './duration.js';
import { selectFiles, type FileSelection } from './files.js';
import { nameForDirectory, nameProblem } from './names.js';
import type { Reporter } from './output.js';
import { packToFile } from './pack.js';
import { CLI_VARIABLES, readEnvFile, requireApiKey, resolveSettings } from './settings.js';

export const TIMEOUT_EXIT_CODE = 124;
export const TAIL_LINES = 30;

export const TERMINAL_OK = new Set(['DEPLOYED']);
export const TERMINAL_FAILED = new Set(['CREATE_FAILED', 'BUILD_FAILED', 'DEPLOY_FAILED', 'SKIPPED', 'INTERRUPTED']);

export interface DeployOptions {
  dir: string;
  name?: string;
  deploymentType: 'dev' | 'prod';
  wait: boolean;
  timeoutMs: number;
  /** Deploy an existing container image (external_docker) instead of packing the directory. */
  image?: string;
  /**
   * Build the Dockerfile in `dir` as this tag (for linux/amd64 on ARM hosts), push it when the tag
   * names a registry, then deploy it like {@link image}.
   */
  buildImage?: string;
  /** The host's architecture (tests); default `process.arch`. */
  arch?: string;
  env?: NodeJS.ProcessEnv;
}

interface Outcome {
  ok: boolean;
  code: number;
  deployment?: Deployment;
  revisionId?: string | null;
  status?: string;
  created?: boolean;
  error?: string;
}

/**
 * The env file's variables sent as the deployment's secrets. Only the names are ever shown; values
 * go to the control plane in the request body only. What is not sent is said, with why: the tool's
 * own settings, names the runtime reserves (the API would refuse them), names that are not
 * environment-variable names.
 */
function appSecrets(envFile: string | undefined, reporter: Reporter): Secret[] | undefined {
  if (!envFile) return undefined;
  const vars = readEnvFile(envFile);
  if (vars.size === 0) return undefined;
  const secrets: Secret[] = [];
  const own: string[] = [];
  const reserved: string[] = [];
  const invalid: string[] = [];
  for (const [name, value] of vars) {
    if ((CLI_VARIABLES as readonly string[]).includes(name)) own.push(name);
    else if (!isSecretKey(name)) invalid.push(name);
    else if (RESERVED_SECRET_NAME.test(name)) reserved.push(name);
    else secrets.push({ name, value });
  }
  const file = path.basename(envFile);
  if (own.length) reporter.info(`not sent as secrets from ${file}: ${own.join(', ')} (settings of keygate deploy itself)`, { not_sent: own, reason: 'deploy_setting' });
  if (reserved.length) reporter.warn(`not sent as secrets from ${file}: ${reserved.join(', ')} (names reserved by the runtime: KEYGATE_*, PATH, HOME, PORT, NODE_*, LD_*)`);
  if (invalid.length) reporter.warn(`not sent as secrets from ${file} (names must be letters, digits and _): ${invalid.join(', ')}`);
  return secrets.length ? secrets : undefined;
}

function urlOf(d: Deployment | undefined): string | null {
  return d?.url ?? (typeof d?.source_config?.custom_url === 'string' ? d.source_config.custom_url : null) ?? null;
}

/** `keygate deploy`: prerequisites, pack, upload, create-or-update, wait. Returns the exit code. */
export async function deploy(opts: DeployOptions, reporter: Reporter): Promise<number> {
  const env = opts.env ?? process.env;
  const dir = path.resolve(opts.dir);
  if (opts.image && opts.buildImage) throw new CliError('give either --image or --build-image, not both', 2);
  let buildRef: ImageRef | undefined;
  if (opts.buildImage) {
    const parsed = parseImageTag(opts.buildImage);
    if (typeof parsed === 'string') throw new CliError(`--build-image: ${parsed}`, 2);
    buildRef = parsed;
  }
  const imageUri = opts.image ?? opts.buildImage;
  const total = opts.image ? 2 : 4;
  let client: ControlPlaneClient | undefined;
  let tmp: string | undefined;
  let outcome: Outcome = { ok: false, code: 1 };
  try {
    // [1] Prerequisites, each with its own message, before anything is sent anywhere.
    reporter.step(1, total, 'Checking prerequisites');
    if (opts.buildImage) reporter.ok(`Dockerfile ${checkBuildContext(dir).dockerfile}`);
    const app = imageUri ? undefined : checkAppDir(dir);
    if (app) reporter.ok(`application ${dir} (assistants: ${app.assistants.join(', ')})`);
    const name = opts.name ?? nameForDirectory(dir);
    if (!opts.name && !name) throw new CliError(`cannot derive a deployment name from the directory '${path.basename(dir)}'; pass --name NAME`);
    const problem = nameProblem(name);
    // A bad --name is a usage error (exit 2, as the help says); a directory name that cannot be
    // used is a prerequisite failure.
    if (problem) throw new CliError(`${problem}${opts.name ? '' : ` (derived from the directory '${path.basename(dir)}'; pass --name NAME)`}`, opts.name ? 2 : 1);
    const settings = resolveSettings(dir, env);
    const apiKey = requireApiKey(settings, dir);
    reporter.ok(`API key (from ${settings.apiKeySource === 'environment' ? 'the environment' : settings.envFile})`, { api_key_source: settings.apiKeySource });
    if (imageUri) {
      const version = checkContainerRuntime(env.KEYGATE_DOCKER ?? 'docker');
      reporter.ok(`container runtime (docker ${version})`);
    }
    if (opts.image) {
      const platform = localImagePlatform(opts.image, env.KEYGATE_DOCKER ?? 'docker');
      if (platform && platform !== TARGET_PLATFORM) {
        reporter.warn(`image ${opts.image} is ${platform}; the control plane runs ${TARGET_PLATFORM}. Build it with: ${suggestedBuildCommand(opts.image)}`);
      }
    }
    client = new ControlPlaneClient({ baseUrl: settings.url, apiKey });
    await client.health();
    const existing = await client.findByName(name); // also proves the key is accepted
    reporter.ok(`control plane ${settings.url}`, { url: settings.url });
    if (existing) {
      reporter.info(`deployment '${name}' exists (${existing.id}): it will be updated in place`, { deployment_id: existing.id, name, action: 'update' });
      const type = existing.source_config?.deployment_type;
      if (type && type !== opts.deploymentType) {
        reporter.warn(`deployment '${name}' is of type ${type}; the type cannot change, so --deployment-type ${opts.deploymentType} is ignored`);
      }
    } else {
      reporter.info(`deployment '${name}' does not exist yet: it will be created (${opts.deploymentType})`, { name, action: 'create' });
    }

    let revisionConfig: { source_tarball_path?: string; image_uri?: string };
    if (app) {
      // [2] Pack
      reporter.step(2, total, 'Packing');
      const sel = selectFiles(dir, { never: app.envFile ? [app.envFile] : [] });
      checkModulesPacked(sel, app.modules);
      tmp = mkdtempSync(path.join(os.tmpdir(), 'keygate-deploy-'));
      const tarball = path.join(tmp, 'source.tar.gz');
      const size = await packToFile(sel, tarball);
      reporter.info(`${sel.files.length} files, ${formatBytes(sel.bytes)} -> ${formatBytes(size)} compressed`, { files: sel.files.length, bytes: sel.bytes, compressed_bytes: size });
      const never = sel.excluded.filter((e) => e.reason === 'always').map((e) => e.path);
      const ignored = sel.excluded.filter((e) => e.reason === 'ignored').length;
      if (never.length || ignored) {
        const parts: string[] = [];
        if (never.length) parts.push(`never packed: ${never.slice(0, 5).join(', ')}${never.length > 5 ? ` and ${never.length - 5} more` : ''}`);
        if (ignored) parts.push(`${ignored} ignored by .gitignore/.keygateignore`);
        reporter.info(`excluded: ${parts.join('; ')}`, { excluded: never, ignored });
      }
      // [3] Upload
      reporter.step(3, total, 'Uploading');
      const up = await client.upload(tarball, size, (sent) => reporter.progress(sent, size));
      reporter.info(`uploaded ${up.size ?? size} bytes (sha256 ${String(up.sha256 ?? '').slice(0, 12)})`, { bytes: up.size ?? size, sha256: up.sha256 });
      revisionConfig = { source_tarball_path: up.source_tarball_path };
    } else if (buildRef && opts.buildImage) {
      await buildAndPush(opts.buildImage, buildRef, dir, opts.arch ?? process.arch, env, reporter);
      revisionConfig = { image_uri: opts.buildImage };
    } else {
      revisionConfig = { image_uri: opts.image };
    }

    // [4] Create or update
    reporter.step(total, total, 'Deploying');
    const secrets = appSecrets(app?.envFile, reporter);
    if (secrets) reporter.info(`secrets from ${app?.envFile}: ${secrets.map((s) => s.name).join(', ')}`, { secrets: secrets.map((s) => s.name) });
    let deployment: Deployment;
    let created = false;
    if (existing) {
      deployment = await client.patchDeployment(existing.id, { source_revision_config: revisionConfig, ...(secrets ? { secrets } : {}) });
    } else {
      try {
        deployment = await client.createDeployment({
          name,
          source: imageUri ? 'external_docker' : 'internal_source',
          source_config: { deployment_type: opts.deploymentType },
          source_revision_config: revisionConfig,
          ...(secrets ? { secrets } : {}),
        });
        created = true;
      } catch (err) {
        // Someone created it between the search and now: update theirs rather than failing.
        if (!(err instanceof ApiError && err.status === 409)) throw err;
        const raced = await client.findByName(name);
        if (!raced) throw err;
        deployment = await client.patchDeployment(raced.id, { source_revision_config: revisionConfig, ...(secrets ? { secrets } : {}) });
      }
    }
    const revisionId = deployment.latest_revision_id;
    reporter.info(`${created ? 'created' : 'updated'} deployment ${deployment.id} (${deployment.name}), revision ${revisionId}`, {
      deployment_id: deployment.id,
      revision_id: revisionId,
      created,
    });
    outcome = { ok: true, code: 0, deployment, revisionId, created, status: undefined };
    if (!revisionId) throw new CliError('the control plane did not report a revision for the deployment');
    if (!opts.wait) {
      reporter.line(`Not waiting (--no-wait). Follow it with: keygate deploy logs ${deployment.id} --type build --follow`);
      return 0;
    }
    outcome = await waitForRevision(client, deployment, revisionId, opts.timeoutMs, reporter);
    outcome.created = created;
    return outcome.code;
  } catch (err) {
    outcome = { ...outcome, ok: false, code: err instanceof CliError ? err.exitCode : 1, error: (err as Error).message };
    throw err;
  } finally {
    reporter.close();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await client?.close();
    if (reporter.json) {
      reporter.emit({
        event: 'result',
        ok: outcome.ok,
        deployment_id: outcome.deployment?.id ?? null,
        revision_id: outcome.revisionId ?? null,
        status: outcome.status ?? null,
        url: urlOf(outcome.deployment),
        created: outcome.created ?? false,
        ...(outcome.error ? { error: outcome.error } : {}),
      });
    }
  }
}

/** Steps 2 and 3 of `--build-image`: the local build (cross-built on ARM) and the push to its registry. */
async function buildAndPush(tag: string, ref: ImageRef, dir: string, arch: string, env: NodeJS.ProcessEnv, reporter: Reporter): Promise<void> {
  const dockerBin = env.KEYGATE_DOCKER ?? 'docker';
  const denv = dockerEnv(env);
  reporter.step(2, 4, 'Building image');
  const started = Date.now();
  reporter.info(`docker build -t ${tag}${arch === 'arm64' || arch === 'arm' ? ` for ${TARGET_PLATFORM} (cross-built on this ${arch} host)` : ''}`, { tag, host_arch: arch });
  await buildImage({ tag, dir, arch, docker: dockerBin, env: denv, onLine: (line, stream) => reporter.toolOutput('docker build', line, stream) });
  reporter.ok(`built ${tag} in ${formatElapsed(Date.now() - started)}`, { tag });
  const platform = localImagePlatform(tag, dockerBin);
  if (platform && platform !== TARGET_PLATFORM) reporter.warn(`image ${tag} is ${platform}; the control plane runs ${TARGET_PLATFORM}`);
  reporter.step(3, 4, 'Pushing image');
  if (!ref.registry) {
    reporter.info(`not pushed: ${tag} names no registry, so it is deployed as is (the control plane's engine must be this one); tag it as REGISTRY/NAME:TAG to push`, { pushed: false });
    return;
  }
  await pushImage({ tag, registry: ref.registry, docker: dockerBin, env: denv, onLine: (line, stream) => reporter.toolOutput('docker push', line, stream) });
  reporter.ok(`pushed ${tag} to ${ref.registry}`, { pushed: true, registry: ref.registry });
}

/** The build would fail later with a vaguer message: say now that an assistant module is excluded. */
function checkModulesPacked(sel: FileSelection, modules: string[]): void {
  const packed = new Set(sel.files);
  for (const m of modules) {
    if (!packed.has(m)) throw new CliError(`keygate.json names ${m}, but it is excluded from the upload (by .gitignore/.keygateignore or the built-in rules)`);
  }
}

/**
 * Polls the revision until it is terminal (backoff 0.5 s -> 2 s), printing each status change with
 * the time since the deployment was submitted. A revision interrupted by a control-plane restart
 * is followed to its replacement when the control plane queued one.
 */
async function waitForRevision(client: ControlPlaneClient, deployment: Deployment, firstRevisionId: string, timeoutMs: number, reporter: Reporter): Promise<Outcome> {
  const started = Date.now();
  let revisionId = firstRevisionId;
  let last = '';
  let since = started;
  let delay = 500;
  let unreachableSince: number | undefined;
  reporter.spin(() => `${last || 'waiting'} ${formatElapsed(Date.now() - since)} (total ${formatElapsed(Date.now() - started)})`);
  for (;;) {
    const elapsed = Date.now() - started;
    if (elapsed >= timeoutMs) {
      reporter.stopSpin();
      const msg = `timed out after ${formatElapsed(elapsed)} waiting for revision ${revisionId} (last status ${last || 'unknown'}); it may still finish: keygate deploy logs ${deployment.id} --type build`;
      reporter.fail(msg);
      return { ok: false, code: TIMEOUT_EXIT_CODE, deployment, revisionId, status: last || undefined, error: msg };
    }
    let rev: Revision | undefined;
    try {
      rev = await client.getRevision(deployment.id, revisionId);
      unreachableSince = undefined;
    } catch (err) {
      // A control plane restarting mid-wait is not a failed deployment: keep trying until the timeout.
      if (err instanceof ApiError || !(err instanceof CliError)) throw err;
      if (unreachableSince === undefined) {
        unreachableSince = Date.now();
        reporter.warn(`${err.message}; retrying`);
      }
    }
    if (rev) {
      if (rev.status !== last) {
        reporter.stopSpin();
        reporter.status(rev.status, Date.now() - started, revisionId, TERMINAL_FAILED.has(rev.status) ? rev.status_message : undefined);
        last = rev.status;
        since = Date.now();
        delay = 500;
        reporter.spin(() => `${last} ${formatElapsed(Date.now() - since)} (total ${formatElapsed(Date.now() - started)})`);
      }
      if (TERMINAL_OK.has(rev.status)) {
        reporter.stopSpin();
        const fresh = await client.getDeployment(deployment.id);
        const url = urlOf(fresh);
        reporter.line(`Deployed ${fresh.name} (revision ${revisionId}) in ${formatElapsed(Date.now() - started)}`);
        if (url) reporter.line(`URL: ${url}`);
        return { ok: true, code: 0, deployment: fresh, revisionId, status: rev.status };
      }
      if (rev.status === 'INTERRUPTED') {
        const fresh = await client.getDeployment(deployment.id);
        if (fresh.latest_revision_id && fresh.latest_revision_id !== revisionId) {
          reporter.info(`revision ${revisionId} was interrupted (control plane restart); following its rebuild ${fresh.latest_revision_id}`);
          revisionId = fresh.latest_revision_id;
          last = '';
          continue;
        }
      }
      if (TERMINAL_FAILED.has(rev.status)) {
        reporter.stopSpin();
        await printFailureTail(client, deployment.id, revisionId, rev, reporter);
        const msg =
          rev.status === 'SKIPPED'
            ? `revision ${revisionId} was skipped: a newer revision of ${deployment.name} superseded it`
            : `revision ${revisionId} ended ${rev.status}${rev.status_message ? `: ${rev.status_message}` : ''}`;
        reporter.fail(msg);
        await reportServing(client, deployment, reporter);
        return { ok: false, code: 1, deployment, revisionId, status: rev.status, error: msg };
      }
    }
    await sleep(Math.max(0, Math.min(delay, timeoutMs - (Date.now() - started))));
    delay = Math.min(2000, Math.round(delay * 1.5));
  }
}

/** After a failure: what answers requests now (an older revision, or nothing at all). */
async function reportServing(client: ControlPlaneClient, deployment: Deployment, reporter: Reporter): Promise<void> {
  try {
    const fresh = await client.getDeployment(deployment.id);
    const active = fresh.active_revision_id ?? null;
    if (active) reporter.info(`revision ${active} keeps serving${urlOf(fresh) ? ` at ${urlOf(fresh)}` : ''}`, { active_revision_id: active });
    else reporter.info(`nothing is serving: no revision of ${fresh.name} is deployed`, { active_revision_id: null });
  } catch (err) {
    reporter.warn(`could not read what is serving: ${(err as Error).message}`);
  }
}

async function printFailureTail(client: ControlPlaneClient, deploymentId: string, revisionId: string, rev: Revision, reporter: Reporter): Promise<void> {
  if (rev.status === 'SKIPPED') return;
  const type = rev.status === 'DEPLOY_FAILED' ? 'deploy' : 'build';
  try {
    let { lines } = await client.tailLogs(deploymentId, { type, revisionId }, TAIL_LINES);
    if (lines.length === 0) {
      // Log lines are committed in small batches; give the last batch a moment to land.
      await sleep(500);
      ({ lines } = await client.tailLogs(deploymentId, { type, revisionId }, TAIL_LINES));
    }
    let shown = type;
    if (lines.length === 0 && type === 'deploy') {
      ({ lines } = await client.tailLogs(deploymentId, { type: 'build', revisionId }, TAIL_LINES));
      shown = 'build';
    }
    if (lines.length === 0) {
      reporter.info(`the ${type} log of revision ${revisionId} is empty`);
      return;
    }
    reporter.line(`--- last ${lines.length} lines of the ${shown} log (revision ${revisionId}) ---`);
    for (const l of lines) reporter.log(l);
    reporter.line('---');
  } catch (err) {
    reporter.warn(`could not read the ${type} log: ${(err as Error).message}`);
  }
}
