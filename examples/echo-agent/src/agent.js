// The echo assistant: reports a step update, then streams the last user message back word by word.
// Plain ESM JavaScript; the JSDoc type gives editors the runtime's interface.

/** @typedef {import('../../../src/runtime/assistant.js').Assistant} Assistant */
/** @typedef {import('../../../src/runtime/assistant.js').RunContext} RunContext */

/**
 * Splits text into tokens that concatenate back to it exactly (words with their trailing space).
 * @param {string} text
 */
export function tokenize(text) {
  return text.match(/\S+\s*|\s+/g) ?? [];
}

/** @type {Assistant} */
const assistant = {
  description: 'Echoes the last user message back, token by token.',

  async run(input, ctx) {
    const messages = input.messages ?? [];
    const last = [...messages].reverse().find((m) => m.role === 'human' || m.role === 'user');
    const text = last ? last.content : '';
    const configurable = /** @type {Record<string, unknown>} */ (ctx.config.configurable ?? {});
    const delayMs = Number(configurable.delay_ms ?? ctx.env.ECHO_DELAY_MS ?? 50);
    const prefix = String(configurable.prefix ?? ctx.env.ECHO_PREFIX ?? '');

    // One step before the reply: what the agent is about to do.
    ctx.update('prepare', { echo_of: text, tokens: tokenize(prefix + text).length });

    const reply = ctx.message.start({ node: 'agent' });
    const tokens = tokenize(prefix + text);
    for (let i = 0; i < tokens.length; i++) {
      if (i > 0 && delayMs > 0) await ctx.sleep(delayMs); // rejects when the run is cancelled
      reply.push(tokens[i]);
      ctx.custom({ progress: i + 1, of: tokens.length });
    }
    ctx.update('agent', { messages: [reply.complete()] });
  },
};

export default assistant;
