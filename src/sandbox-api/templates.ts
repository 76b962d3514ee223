import { Ajv } from 'ajv';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { ajvToIssues, formatLoc } from '../validation/errors.js';
import { jsonErrorLocation } from '../validation/json.js';
import type { BoxResources, DriverName } from '../sandbox/driver.js';

/**
 * A sandbox template: what a box is built from. `rootfs` (`host` or an absolute directory) lets the
 * `local` driver build it, `image` (a local image) the `docker` driver; `none` records any template.
 */
export interface Template {
  name: string;
  description: string;
  rootfs?: string;
  image?: string;
  environment: Record<string, string>;
  /** Defaults for boxes of this template; a create may override each. */
  resources?: Partial<BoxResources>;
  /** The most a create may ask of each resource for a box of this template (422 past it). */
  max_resources?: Partial<BoxResources>;
}

/** Used where neither the template nor the request says. */
export const DEFAULT_RESOURCES: BoxResources = { memory_mb: 512, cpus: 1, pids: 256, disk_mb: 1024 };

export const resourcesSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    memory_mb: { type: 'integer', minimum: 16, maximum: 65536, description: 'Memory limit, MiB.' },
    cpus: { type: 'number', exclusiveMinimum: 0, maximum: 64, description: 'CPUs (fractions allowed).' },
    pids: { type: 'integer', minimum: 8, maximum: 65536, description: 'Most processes and threads at once.' },
    disk_mb: { type: 'integer', minimum: 16, maximum: 1048576, description: 'Size of /workspace, MiB (its own file system: a write past it fails with ENOSPC in the box, an upload past it is a 413).' },
  },
} as const;

/** Which drivers can build a template. */
export function driversFor(t: Template): DriverName[] {
  const out: DriverName[] = [];
  if (t.rootfs) out.push('local');
  if (t.image) out.push('docker');
  out.push('none');
  return out;
}

/**
 * What a create asks beyond the template's max_resources, located at the request's field (the
 * operator caps what one API caller may take of the host per box: memory, CPU, processes, disk).
 */
export function resourceCapIssues(t: Template, requested: Partial<BoxResources> | undefined): { loc: (string | number)[]; msg: string; type: string }[] {
  const out: { loc: (string | number)[]; msg: string; type: string }[] = [];
  for (const [k, v] of Object.entries(requested ?? {}) as [keyof BoxResources, number][]) {
    const max = t.max_resources?.[k];
    if (max !== undefined && v > max) out.push({ loc: ['body', 'resources', k], msg: `Template '${t.name}' allows at most ${max} for ${k}`, type: 'less_than_equal' });
  }
  return out;
}

/** The template's defaults, then the request's overrides. */
export function applyResources(t: Template, requested: Partial<BoxResources> | undefined): BoxResources {
  // A built-in default above the template's cap is the cap (a template that caps pids at 128 and
  // says no more gets 128, not an error).
  const defaults = { ...DEFAULT_RESOURCES };
  for (const [k, max] of Object.entries(t.max_resources ?? {}) as [keyof BoxResources, number][]) if (defaults[k] > max) defaults[k] = max;
  return { ...defaults, ...t.resources, ...requested };
}

export const TEMPLATES_FILE = 'templates.json';

export const templateSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'description', 'environment'],
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9][A-Za-z0-9._-]*$' },
    description: { type: 'string', maxLength: 1000 },
    rootfs: { type: 'string', pattern: '^(host|/.*)$', maxLength: 4096, description: "local driver: 'host' (the host's /usr, /bin, /lib*, a minimal /etc, read-only) or an absolute root filesystem directory." },
    image: { type: 'string', minLength: 1, maxLength: 512, description: 'docker driver: a local image (no registry is asked); see scripts/build-images.sh.' },
    resources: resourcesSchema,
    max_resources: { ...resourcesSchema, description: 'The most a create may ask of each resource for a box of this template; the defaults (resources) must stay within it.' },
    environment: {
      type: 'object',
      propertyNames: { pattern: '^[A-Za-z_][A-Za-z0-9_]*$' },
      additionalProperties: { type: 'string', maxLength: 8192 },
    },
  },
} as const;

const fileSchema = { type: 'array', maxItems: 1000, items: templateSchema } as const;

export class TemplatesError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TemplatesError';
  }
}

/**
 * Reads `<configDir>/templates.json`. A missing file is an empty catalogue (every create is then
 * a 422 on template_name, which says what to do); a malformed one stops the server at start with
 * the file, the JSON path and the reason, rather than failing creates one by one later.
 */
export function loadTemplates(configDir: string): Map<string, Template> {
  const file = path.join(configDir, TEMPLATES_FILE);
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
      // The file is optional; the directory is not: a mistyped --config-dir / KEYGATE_CONFIG_DIR
      // would otherwise start a server with no templates (and no providers) and say nothing.
      if (!existsSync(configDir)) throw new TemplatesError(`configuration directory ${configDir} does not exist (--config-dir or KEYGATE_CONFIG_DIR)`);
      return new Map();
    }
    throw new TemplatesError(`cannot read ${file}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new TemplatesError(`${file} is not valid JSON (${jsonErrorLocation(text, err)})`);
  }
  const validate = new Ajv({ allErrors: true, strict: false }).compile(fileSchema);
  if (!validate(value)) {
    const lines = ajvToIssues(validate.errors).map((i) => `  ${i.loc.length ? formatLoc(i.loc) : '(root)'}: ${i.msg}`);
    throw new TemplatesError(`invalid templates file ${file}:\n${lines.join('\n')}`);
  }
  const out = new Map<string, Template>();
  for (const [i, t] of (value as Template[]).entries()) {
    if (out.has(t.name)) throw new TemplatesError(`invalid templates file ${file}: [${i}].name '${t.name}' is defined twice`);
    // The defaults a create gets without asking must be within the caps.
    for (const [k, v] of Object.entries(applyResources(t, undefined)) as [keyof BoxResources, number][]) {
      const max = t.max_resources?.[k];
      if (max !== undefined && v > max) throw new TemplatesError(`invalid templates file ${file}: [${i}] '${t.name}': resources.${k} ${v} is above max_resources.${k} ${max}`);
    }
    out.set(t.name, t);
  }
  return out;
}
