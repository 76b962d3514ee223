import { Ajv } from 'ajv';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { ajvToIssues, formatLoc } from '../validation/errors.js';
import { jsonErrorLocation } from '../validation/json.js';

/** A sandbox template: what a box is built from (the image and its environment). */
export interface Template {
  name: string;
  description: string;
  image: string;
  environment: Record<string, string>;
}

export const TEMPLATES_FILE = 'templates.json';

export const templateSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'description', 'image', 'environment'],
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9][A-Za-z0-9._-]*$' },
    description: { type: 'string', maxLength: 1000 },
    image: { type: 'string', minLength: 1, maxLength: 512 },
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
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return new Map();
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
    out.set(t.name, t);
  }
  return out;
}
