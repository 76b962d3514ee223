import { EnvHttpProxyAgent, fetch as undiciFetch, type Dispatcher } from 'undici';

/**
 * A fetch for assistants that honours HTTPS_PROXY / HTTP_PROXY / NO_PROXY (and their lower-case
 * forms). Node 20's global fetch ignores them, so an app in a sandbox would bypass the auth proxy
 * and reach the API without the credentials the proxy injects.
 *
 * The variables are read when the fetch is created: create it after the app's env is applied.
 * TLS trust comes from Node's defaults, so NODE_EXTRA_CA_CERTS (the proxy's CA in a sandbox) is
 * honoured.
 */
export function createProxyFetch(dispatcher: Dispatcher = new EnvHttpProxyAgent()): typeof globalThis.fetch {
  const f = (input: Parameters<typeof globalThis.fetch>[0], init?: Parameters<typeof globalThis.fetch>[1]) =>
    undiciFetch(input as Parameters<typeof undiciFetch>[0], { ...(init as object), dispatcher } as Parameters<typeof undiciFetch>[1]);
  return f as unknown as typeof globalThis.fetch;
}
