import { describe, expect, it } from 'vitest';
import { boundRevocationUrl, flowTokenUrl, secretRebindProblem } from '../../src/auth/endpoints.js';

const provider = { token_url: 'https://now.example/token', revocation_url: 'https://now.example/revoke', client_secret_sealed: 'sealed' };

describe('endpoints a sign-in and its token are bound to', () => {
  it('a bound flow and token use what they were given, even null; rows from before the binding use the provider', () => {
    expect(flowTokenUrl({ endpoints_bound: 1, token_url: 'https://then.example/token', revocation_url: null }, provider)).toBe('https://then.example/token');
    expect(flowTokenUrl({ endpoints_bound: 0, token_url: null, revocation_url: null }, provider)).toBe(provider.token_url);
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'https://then.example/revoke' }, provider)).toBe('https://then.example/revoke');
    // Issued by a provider without revocation endpoint: one added later does not receive it.
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: null }, provider)).toBeNull();
    expect(boundRevocationUrl({ endpoints_bound: 0, revocation_url: null }, provider)).toBe(provider.revocation_url);
  });
  it('a token follows its provider to another path of the same origin, never to another origin', () => {
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'https://now.example/old/revoke' }, provider)).toBe(provider.revocation_url);
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'https://now.example:8443/revoke' }, provider)).toBe('https://now.example:8443/revoke');
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'http://now.example/revoke' }, provider)).toBe('http://now.example/revoke');
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'https://now.example.evil.test/revoke' }, provider)).toBe('https://now.example.evil.test/revoke');
    expect(boundRevocationUrl({ endpoints_bound: 1, revocation_url: 'https://now.example/revoke' }, { ...provider, revocation_url: null })).toBe('https://now.example/revoke');
  });
});

describe('secretRebindProblem', () => {
  it('refuses moving token_url or revocation_url while a secret is stored, unless the secret is given again', () => {
    expect(secretRebindProblem(provider, { token_url: 'https://else.example/t' })).toMatch(/^changing token_url would send the stored client_secret/);
    expect(secretRebindProblem(provider, { revocation_url: null })).toMatch(/^changing revocation_url /);
    expect(secretRebindProblem(provider, { token_url: 'https://else.example/t', revocation_url: 'https://else.example/r' })).toMatch(/^changing token_url and revocation_url /);
    expect(secretRebindProblem(provider, { token_url: 'https://else.example/t', client_secret: 'given-again' })).toBeUndefined();
    expect(secretRebindProblem(provider, { token_url: 'https://else.example/t', client_secret: null })).toBeUndefined();
  });
  it('lets through what sends the secret nowhere new', () => {
    expect(secretRebindProblem(provider, { token_url: provider.token_url, revocation_url: provider.revocation_url })).toBeUndefined();
    expect(secretRebindProblem(provider, {})).toBeUndefined();
    expect(secretRebindProblem({ ...provider, client_secret_sealed: null }, { token_url: 'https://else.example/t' })).toBeUndefined();
  });
});
