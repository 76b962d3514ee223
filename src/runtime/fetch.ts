import { EnvHttpProxyAgent, fetch as undiciFetch, type Dispatcher } from 'undici';

/**
 * The proxy settings from an environment, curl-style: lower-case names first, and an empty value
 * counts as unset (undici alone would let an empty `https_proxy` hide a set `HTTPS_PROXY` and go
 * out directly, around the auth proxy).
 */
export function proxyEnv(env: NodeJS.ProcessEnv): { httpProxy?: string; httpsProxy?: string; noProxy?: string } {
  const pick = (a: string, b: string) => env[a] || env[b] || undefined;
  const httpProxy = pick('http_proxy', 'HTTP_PROXY');
  return {
    httpProxy,
    httpsProxy: pick('https_proxy', 'HTTPS_PROXY') ?? httpProxy,
    noProxy: pick('no_proxy', 'NO_PROXY'),
  };
}

/**
 * A fetch for assistants that honours HTTPS_PROXY / HTTP_PROXY / NO_PROXY (and their lower-case
 * forms). Node 20's global fetch ignores them, so an app in a sandbox would bypass the auth proxy
 * and reach the API without the credentials the proxy injects.
 *
 * The variables are read when the fetch is created: create it after the app's env is applied.
 * TLS trust comes from Node's defaults, so NODE_EXTRA_CA_CERTS (the proxy's CA in a sandbox) is
 * honoured.
 */
export function createProxyFetch(env: NodeJS.ProcessEnv = process.env, dispatcher?: Dispatcher): typeof globalThis.fetch {
  const { httpProxy, httpsProxy, noProxy } = proxyEnv(env);
  // Explicit empty strings stop undici from consulting the environment again on its own.
  const agent = dispatcher ?? new EnvHttpProxyAgent({ httpProxy: httpProxy ?? '', httpsProxy: httpsProxy ?? '', noProxy: noProxy ?? '' });
  const f = (input: Parameters<typeof globalThis.fetch>[0], init?: Parameters<typeof globalThis.fetch>[1]) =>
    undiciFetch(input as Parameters<typeof undiciFetch>[0], { ...(init as object), dispatcher: agent } as Parameters<typeof undiciFetch>[1]);
  return f as unknown as typeof globalThis.fetch;
}
