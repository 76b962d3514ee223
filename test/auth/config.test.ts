// Start-up configuration of the Auth Service: providers from config files, JWT issuer settings
// (including a JWKS endpoint), and the pure helpers of the code flow.
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { exportJWK, SignJWT } from 'jose';
import { afterAll, describe, expect, it } from 'vitest';
import { parseProvidersFile, providerFiles } from '../../src/auth/provider-config.js';
import { jwtConfigFromEnv } from '../../src/auth/jwt.js';
import { authorizeUrl, coversScopes, newVerifier, normaliseScopes, s256Challenge } from '../../src/auth/pkce.js';
import { runCli, startCli } from '../helpers/cli.js';

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(path.join(os.tmpdir(), 'keygate-auth-cfg-'));
  dirs.push(d);
  return d;
};
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const entry = {
  provider_id: 'gh',
  name: 'GitHub',
  client_id: 'abc',
  auth_url: 'https://github.com/login/oauth/authorize',
  token_url: 'https://github.com/login/oauth/access_token',
  token_endpoint_auth_method: 'client_secret_post',
};

function file(content: unknown): string {
  const f = path.join(tmp(), 'providers.json');
  writeFileSync(f, typeof content === 'string' ? content : JSON.stringify(content));
  return f;
}

describe('providers from config', () => {
  it('reads the secret from the named environment variable and applies defaults', () => {
    const [p] = parseProvidersFile(file([{ ...entry, client_secret_env: 'GH_SECRET', scopes: ['repo', 'repo'] }]), { GH_SECRET: 's3cret-value' });
    expect(p.workspace).toBe('default');
    expect(p.provider).toMatchObject({ provider_id: 'gh', client_secret: 's3cret-value', uses_pkce: true, scopes: ['repo'] });
  });

  it('names the file and field of every mistake, without echoing secrets', () => {
    expect(() => parseProvidersFile(file([{ ...entry, client_secret_env: 'MISSING_SECRET' }]), {})).toThrow(/\[0\]\.client_secret_env: environment variable MISSING_SECRET is not set/);
    expect(() => parseProvidersFile(file([{ ...entry, client_secret: 'inline-secret-x', client_secret_env: 'X' }]), { X: 'y' })).toThrow(/not both/);
    expect(() => parseProvidersFile(file([{ ...entry }]), {})).toThrow(/needs a client_secret/);
    expect(() => parseProvidersFile(file([{ ...entry, token_url: 'ftp://nope', client_secret: 'inline-secret-x' }]), {})).toThrow(/\[0\]\.token_url/);
    expect(() => parseProvidersFile(file([{ ...entry, client_secret: 'inline-secret-x' }, { ...entry, client_secret: 'inline-secret-x' }]), {})).toThrow(/listed twice/);
    expect(() => parseProvidersFile(file('{not json'), {})).toThrow(/providers\.json: cannot read providers/);
    try {
      parseProvidersFile(file([{ ...entry, client_secret: 'inline-secret-x', auth_url: 'nope' }]), {});
    } catch (err) {
      expect((err as Error).message).not.toContain('inline-secret-x');
    }
  });

  it('refuses plain http endpoints except on a loopback address (credentials travel only over TLS)', () => {
    const s = { client_secret: 'inline-secret-x' };
    for (const field of ['auth_url', 'token_url', 'revocation_url'] as const) {
      expect(() => parseProvidersFile(file([{ ...entry, ...s, [field]: 'http://idp.example.com/x' }]), {})).toThrow(new RegExp(`\\[0\\]\\.${field}: ${field} must use https`));
      expect(() => parseProvidersFile(file([{ ...entry, ...s, [field]: 'http://10.0.0.7/x' }]), {})).toThrow(/must use https/);
    }
    for (const url of ['http://127.0.0.1:9000/token', 'http://localhost/token', 'http://[::1]:8080/token', 'http://idp.localhost/token', 'https://idp.example.com/token']) {
      expect(parseProvidersFile(file([{ ...entry, ...s, token_url: url }]), {})[0].provider.token_url).toBe(url);
    }
  });

  it('loads <config-dir>/providers.json when present and requires KEYGATE_PROVIDERS_FILE to exist', () => {
    const dir = tmp();
    expect(providerFiles(dir, {})).toEqual([]);
    writeFileSync(path.join(dir, 'providers.json'), '[]');
    expect(providerFiles(dir, {})).toEqual([path.join(dir, 'providers.json')]);
    expect(() => providerFiles(dir, { KEYGATE_PROVIDERS_FILE: path.join(dir, 'nope.json') })).toThrow(/does not exist/);
  });

  it('does not load the shipped example', () => {
    expect(providerFiles(path.resolve('config'), {})).toEqual([]);
    // ...but the example is a valid providers file.
    const parsed = parseProvidersFile(path.resolve('config/providers.example.json'), { GITHUB_OAUTH_CLIENT_SECRET: 'x', GOOGLE_OAUTH_CLIENT_SECRET: 'y' });
    expect(parsed.map((p) => p.provider.provider_id)).toEqual(['github', 'google']);
  });

  it('stops keygate serve with a one-line error on a bad providers file', () => {
    const f = file([{ ...entry, client_secret_env: 'UNSET_SECRET_FOR_TEST' }]);
    const r = runCli(['serve', '--listen', '127.0.0.1:0', '--data', tmp()], { env: { DATABASE_URL: '', KEYGATE_PROVIDERS_FILE: f }, timeoutMs: 30_000 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('environment variable UNSET_SECRET_FOR_TEST is not set');
  });
});

describe('JWT issuer settings', () => {
  it('is off without settings and refuses half or contradictory settings', () => {
    expect(jwtConfigFromEnv({})).toBeUndefined();
    expect(() => jwtConfigFromEnv({ KEYGATE_JWT_ISSUER: 'i' })).toThrow(/KEYGATE_JWT_AUDIENCE/);
    expect(() => jwtConfigFromEnv({ KEYGATE_JWT_ISSUER: 'i', KEYGATE_JWT_AUDIENCE: 'a' })).toThrow(/exactly one/);
    expect(() => jwtConfigFromEnv({ KEYGATE_JWT_ISSUER: 'i', KEYGATE_JWT_AUDIENCE: 'a', KEYGATE_JWT_JWKS_URL: 'http://x', KEYGATE_JWT_PUBLIC_KEY_FILE: '/x' })).toThrow(/exactly one/);
    expect(() => jwtConfigFromEnv({ KEYGATE_JWT_ISSUER: 'i', KEYGATE_JWT_AUDIENCE: 'a', KEYGATE_JWT_JWKS_URL: 'http://x', KEYGATE_JWT_ALGORITHMS: 'HS256' })).toThrow(/not an allowed asymmetric algorithm: HS256/);
    expect(() => jwtConfigFromEnv({ KEYGATE_JWT_ISSUER: 'i', KEYGATE_JWT_AUDIENCE: 'a', KEYGATE_JWT_PUBLIC_KEY_FILE: '/nonexistent.pem' })).toThrow(/cannot load a public key/);
  });

  it('verifies bearer tokens against a JWKS endpoint (keygate serve, loopback)', async () => {
    const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
    const jwks = http.createServer((_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ keys: [jwk] }));
    });
    await new Promise<void>((r) => jwks.listen(0, '127.0.0.1', r));
    const dataDir = tmp();
    const server = await startCli(['serve', '--listen', '127.0.0.1:0', '--data', dataDir], {
      env: {
        DATABASE_URL: '',
        KEYGATE_JWT_ISSUER: 'https://idp.test',
        KEYGATE_JWT_AUDIENCE: 'keygate',
        KEYGATE_JWT_JWKS_URL: `http://127.0.0.1:${(jwks.address() as AddressInfo).port}/jwks.json`,
        KEYGATE_JWT_ALGORITHMS: 'RS256',
      },
    });
    try {
      const sign = (alg = 'RS256', key: Parameters<SignJWT['sign']>[0] = privateKey) =>
        new SignJWT({ sub: 'erin', tenant_id: 'default' }).setProtectedHeader({ alg, kid: 'k1' }).setIssuer('https://idp.test').setAudience('keygate').setExpirationTime('2m').sign(key);
      const ok = await fetch(`${server.url}/v2/auth/tokens`, { headers: { authorization: `Bearer ${await sign()}` } });
      expect(ok.status).toBe(200);
      expect(await ok.json()).toEqual([]);
      const ps = await fetch(`${server.url}/v2/auth/tokens`, { headers: { authorization: `Bearer ${await sign('PS256')}` } });
      expect(ps.status).toBe(401); // outside the configured allow-list
      const other = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
      const forged = await fetch(`${server.url}/v2/auth/tokens`, { headers: { authorization: `Bearer ${await sign('RS256', other)}` } });
      expect(forged.status).toBe(401);
    } finally {
      await server.stop();
      await new Promise((r) => jwks.close(r));
    }
  });
});

describe('code flow helpers', () => {
  it('derives the S256 challenge and builds the authorization URL', () => {
    const v = newVerifier();
    expect(v).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(s256Challenge(v)).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(s256Challenge(v)).not.toBe(s256Challenge(newVerifier()));
    const url = new URL(authorizeUrl({ authUrl: 'https://idp.test/auth?prompt=consent', clientId: 'c', redirectUri: 'http://127.0.0.1:1/cb', scopes: ['a', 'b'], state: 's', codeChallenge: 'x' }));
    expect(Object.fromEntries(url.searchParams)).toEqual({ prompt: 'consent', response_type: 'code', client_id: 'c', redirect_uri: 'http://127.0.0.1:1/cb', scope: 'a b', state: 's', code_challenge: 'x', code_challenge_method: 'S256' });
    expect(new URL(authorizeUrl({ authUrl: 'https://idp.test/auth', clientId: 'c', redirectUri: 'r', scopes: [], state: 's' })).searchParams.has('code_challenge')).toBe(false);
  });

  it('compares scope sets', () => {
    expect(coversScopes(['a', 'b'], ['b'])).toBe(true);
    expect(coversScopes(['a'], ['a', 'b'])).toBe(false);
    expect(coversScopes(['a'], [])).toBe(true);
    expect(normaliseScopes([' a', 'a', '', 'b'])).toEqual(['a', 'b']);
  });
});
