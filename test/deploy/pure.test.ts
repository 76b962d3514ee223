import { describe, expect, it } from 'vitest';
import { SseParser, describeDetail } from '../../src/deploy/client.js';
import { platformArgs, suggestedBuildCommand } from '../../src/deploy/docker.js';
import { formatBytes, formatElapsed, parseDuration } from '../../src/deploy/duration.js';
import { nameForDirectory, nameProblem, normaliseName } from '../../src/deploy/names.js';
import { colourEnabled, formatTable, progressBar } from '../../src/deploy/output.js';
import { sinceToIso } from '../../src/deploy/manage.js';

describe('deployment name normalisation', () => {
  it.each([
    ['echo-agent', 'echo-agent'],
    ['My App', 'my-app'],
    ['My__App!!v2', 'my-app-v2'],
    ['--lead--and--trail--', 'lead-and-trail'],
    ['Café Über', 'cafe-uber'],
    ['UPPER.case.dots', 'upper-case-dots'],
    ['a  b\tc', 'a-b-c'],
    ['日本語', ''],
    ['___', ''],
    ['', ''],
  ])('%j -> %j', (raw, want) => {
    expect(normaliseName(raw)).toBe(want);
  });

  it('cuts at 63 characters without leaving a trailing dash', () => {
    const long = 'a'.repeat(62) + '-bcdef';
    expect(normaliseName(long)).toBe('a'.repeat(62));
    expect(normaliseName('x'.repeat(100))).toHaveLength(63);
    for (const s of ['x'.repeat(100), long, 'Hello World '.repeat(10)]) expect(nameProblem(normaliseName(s))).toBeNull();
  });

  it('derives the name from the directory base name', () => {
    expect(nameForDirectory('/tmp/some/Echo Agent')).toBe('echo-agent');
    expect(nameForDirectory('/tmp/x/my_app/')).toBe('my-app');
  });

  it('validates explicit names', () => {
    expect(nameProblem('ok-name-1')).toBeNull();
    expect(nameProblem('')).toMatch(/empty/);
    expect(nameProblem('Upper')).toMatch(/invalid deployment name/);
    expect(nameProblem('-dash')).toMatch(/invalid/);
    expect(nameProblem('dash-')).toMatch(/invalid/);
    expect(nameProblem('under_score')).toMatch(/invalid/);
    expect(nameProblem('a'.repeat(64))).toMatch(/longer than 63/);
  });
});

describe('durations', () => {
  it('parses the forms the CLI accepts', () => {
    expect(parseDuration('10m')).toBe(600_000);
    expect(parseDuration('90')).toBe(90_000);
    expect(parseDuration('1.5')).toBe(1500);
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('1h30m')).toBe(5_400_000);
    expect(parseDuration('2d')).toBe(172_800_000);
    expect(parseDuration(' 30s ')).toBe(30_000);
  });
  it('rejects everything else', () => {
    for (const bad of ['', 'm', '10x', '10m foo', '-5s', 'ten', '5s10', '1e3']) expect(parseDuration(bad)).toBeNull();
  });
  it('formats elapsed time and sizes', () => {
    expect(formatElapsed(3140)).toBe('3.1s');
    expect(formatElapsed(0)).toBe('0.0s');
    expect(formatElapsed(125_000)).toBe('2m05s');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(5 * 1024 * 1024)).toBe('5.0 MiB');
  });
  it('turns --since into an ISO time', () => {
    const now = Date.parse('2025-01-01T12:00:00.000Z');
    expect(sinceToIso('10m', now)).toBe('2025-01-01T11:50:00.000Z');
    expect(sinceToIso('2025-01-01T10:00:00Z', now)).toBe('2025-01-01T10:00:00.000Z');
    expect(() => sinceToIso('yesterday', now)).toThrow(/neither a duration/);
  });
});

describe('output helpers', () => {
  it('draws a bounded progress bar', () => {
    expect(progressBar(0, 100, 10)).toBe('[----------]   0%  0 B/100 B');
    expect(progressBar(50, 100, 10)).toBe('[#####-----]  50%  50 B/100 B');
    expect(progressBar(200, 100, 10)).toBe('[##########] 100%  200 B/100 B');
    expect(progressBar(0, 0, 4)).toBe('[####] 100%  0 B/0 B');
  });
  it('aligns table columns and shows empty cells as -', () => {
    const t = formatTable(['ID', 'NAME', 'URL'], [
      ['1', 'alpha', 'http://x'],
      ['22', null, ''],
    ]);
    expect(t.split('\n')).toEqual(['ID  NAME   URL', '1   alpha  http://x', '22  -      -']);
  });
  it('uses colour only on a terminal without NO_COLOR', () => {
    expect(colourEnabled({ isTTY: true }, {})).toBe(true);
    expect(colourEnabled({ isTTY: false }, {})).toBe(false);
    expect(colourEnabled({}, {})).toBe(false);
    expect(colourEnabled({ isTTY: true }, { NO_COLOR: '1' })).toBe(false);
  });
  it('describes error bodies in one sentence', () => {
    expect(describeDetail({ detail: 'Deployment ID x not found.' }, 'f')).toBe('Deployment ID x not found.');
    expect(describeDetail({ detail: [{ loc: ['body', 'name'], msg: 'bad', type: 't' }, { loc: ['query', 'limit'], msg: 'too big' }] }, 'f')).toBe('body.name: bad; query.limit: too big');
    expect(describeDetail(undefined, 'HTTP 500')).toBe('HTTP 500');
  });
});

describe('server-sent events framing', () => {
  it('parses events split across arbitrary chunks, skipping comments', () => {
    const got: [string, string][] = [];
    const p = new SseParser((e, d) => got.push([e, d]));
    const text = ': heartbeat\n\nevent: log\ndata: {"a":1}\n\nevent: log\r\ndata: line1\r\ndata: line2\r\n\r\ndata: plain\n\n';
    for (const ch of text) p.push(ch); // one character at a time: the worst split
    expect(got).toEqual([
      ['log', '{"a":1}'],
      ['log', 'line1\nline2'],
      ['message', 'plain'],
    ]);
  });
});

describe('container image builds', () => {
  it('cross-builds for linux/amd64 on ARM hosts only', () => {
    expect(platformArgs('arm64')).toEqual(['--platform', 'linux/amd64']);
    expect(platformArgs('x64')).toEqual([]);
    expect(suggestedBuildCommand('me/app:1', 'arm64')).toBe('docker build --platform linux/amd64 -t me/app:1 .');
    expect(suggestedBuildCommand('me/app:1', 'x64')).toBe('docker build -t me/app:1 .');
  });
});
