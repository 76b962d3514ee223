// Describes a GitHub repository ("owner/name" in the last user message). The app holds no token:
// it calls the API through HTTPS_PROXY with ctx.fetch, and the keygate auth proxy in front of the
// sandbox adds the Authorization header for api.github.com. Node's global fetch would ignore
// HTTPS_PROXY and go out directly, without credentials.

/** @typedef {import('../../../src/runtime/assistant.js').Assistant} Assistant */

const REPO_RE = /([A-Za-z0-9-]{1,39})\/([A-Za-z0-9._-]{1,100})/;

/** The API answered with an error status; the run fails with this name and message. */
export class UpstreamError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'UpstreamError';
  }
}

/** @type {Assistant} */
const assistant = {
  description: 'Describes a GitHub repository named as owner/name in the last user message.',

  async run(input, ctx) {
    const last = [...(input.messages ?? [])].reverse().find((m) => m.role === 'human' || m.role === 'user');
    const match = REPO_RE.exec(last?.content ?? '');
    if (!match) throw new Error('Name a repository as owner/name, e.g. "octocat/Hello-World".');
    const [, owner, repo] = match;
    const base = (ctx.env.GITHUB_API_URL ?? 'https://api.github.com').replace(/\/+$/, '');

    const res = await ctx.fetch(`${base}/repos/${encodeURIComponent(owner)}/${encodeURIComponent(repo)}`, {
      headers: { accept: 'application/vnd.github+json', 'user-agent': 'keygate-example-github-agent' },
      signal: ctx.signal,
    });
    ctx.update('fetch', { repository: `${owner}/${repo}`, status: res.status });
    if (!res.ok) {
      await res.body?.cancel();
      throw new UpstreamError(`GitHub answered ${res.status} for ${owner}/${repo}`);
    }
    const data = /** @type {{full_name?: string, description?: string|null, stargazers_count?: number, language?: string|null}} */ (
      await res.json()
    );
    ctx.custom({ stars: data.stargazers_count ?? 0 });

    const text =
      `${data.full_name ?? `${owner}/${repo}`}: ${data.description ?? 'no description'}` +
      ` (${data.stargazers_count ?? 0} stars${data.language ? `, ${data.language}` : ''})`;
    const reply = ctx.message.start({ node: 'answer' });
    for (const token of text.match(/\S+\s*/g) ?? []) reply.push(token);
    ctx.update('answer', { messages: [reply.complete()] });
  },
};

export default assistant;
