import { createPublicKey, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRemoteJWKSet, errors as joseErrors, jwtVerify, type JWTVerifyGetKey } from 'jose';
import type { FastifyRequest } from 'fastify';
import type { Authenticator } from '../server/auth.js';
import { ensureUser } from '../server/auth.js';
import { HttpError } from '../server/errors.js';
import type { Db } from '../store/db.js';

/**
 * `Authorization: Bearer <JWT>` signed by the configured issuer (verified with `jose`):
 *   KEYGATE_JWT_ISSUER, KEYGATE_JWT_AUDIENCE (both required), and the key from
 *   KEYGATE_JWT_JWKS_URL or KEYGATE_JWT_PUBLIC_KEY_FILE (PEM, SPKI or certificate).
 *   KEYGATE_JWT_ALGORITHMS optionally narrows the asymmetric allow-list below.
 * `exp` is required, `nbf`/`iss`/`aud` are checked, `sub` names the user and `tenant_id` (or
 * `workspace_id`) the workspace id, which must exist. The user is created on first sight as the
 * workspace user whose name is `sub`, so an API key of user `alice` and a token with `sub: alice`
 * act as the same owner.
 */

/** Asymmetric only: a shared-secret HS* token could be minted by anyone holding the verifier. */
export const DEFAULT_JWT_ALGORITHMS = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519'];

export interface JwtConfig {
  issuer: string;
  audience: string;
  algorithms: string[];
  key: KeyObject | JWTVerifyGetKey;
}

export class JwtConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'JwtConfigError';
  }
}

/** Reads the JWT settings; undefined when bearer tokens are not configured at all. */
export function jwtConfigFromEnv(env: NodeJS.ProcessEnv): JwtConfig | undefined {
  const issuer = env.KEYGATE_JWT_ISSUER?.trim();
  const audience = env.KEYGATE_JWT_AUDIENCE?.trim();
  const jwksUrl = env.KEYGATE_JWT_JWKS_URL?.trim();
  const keyFile = env.KEYGATE_JWT_PUBLIC_KEY_FILE?.trim();
  if (!issuer && !audience && !jwksUrl && !keyFile) return undefined;
  if (!issuer || !audience) throw new JwtConfigError('bearer tokens need both KEYGATE_JWT_ISSUER and KEYGATE_JWT_AUDIENCE');
  if (!!jwksUrl === !!keyFile) throw new JwtConfigError('set exactly one of KEYGATE_JWT_JWKS_URL and KEYGATE_JWT_PUBLIC_KEY_FILE');
  const requested = env.KEYGATE_JWT_ALGORITHMS?.split(',').map((a) => a.trim()).filter(Boolean);
  const algorithms = requested?.length ? requested : DEFAULT_JWT_ALGORITHMS;
  const bad = algorithms.filter((a) => !DEFAULT_JWT_ALGORITHMS.includes(a));
  if (bad.length) throw new JwtConfigError(`KEYGATE_JWT_ALGORITHMS: not an allowed asymmetric algorithm: ${bad.join(', ')}`);
  let key: KeyObject | JWTVerifyGetKey;
  if (jwksUrl) {
    let url: URL;
    try {
      url = new URL(jwksUrl);
    } catch {
      throw new JwtConfigError('KEYGATE_JWT_JWKS_URL is not a URL');
    }
    if (url.protocol !== 'https:' && url.protocol !== 'http:') throw new JwtConfigError('KEYGATE_JWT_JWKS_URL must be http(s)');
    key = createRemoteJWKSet(url, { timeoutDuration: 5000, cooldownDuration: 30_000 });
  } else {
    try {
      key = createPublicKey(readFileSync(keyFile!, 'utf8'));
    } catch (err) {
      throw new JwtConfigError(`KEYGATE_JWT_PUBLIC_KEY_FILE: cannot load a public key from ${keyFile} (${(err as NodeJS.ErrnoException).code ?? 'not a PEM public key'})`);
    }
  }
  return { issuer, audience, algorithms, key };
}

function bearerToken(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  if (typeof h !== 'string') return undefined;
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(h);
  return m ? m[1] : undefined;
}

/** Why a token was refused, in words that carry nothing of the token itself. */
function reason(err: unknown): string {
  if (err instanceof joseErrors.JWTExpired) return 'it has expired';
  if (err instanceof joseErrors.JWTClaimValidationFailed) return `its ${err.claim} claim is not acceptable`;
  if (err instanceof joseErrors.JOSEAlgNotAllowed) return 'its algorithm is not allowed';
  if (err instanceof joseErrors.JWSSignatureVerificationFailed) return 'its signature does not verify';
  if (err instanceof joseErrors.JWKSNoMatchingKey) return 'no issuer key matches it';
  if (err instanceof joseErrors.JWKSTimeout) return 'the issuer keys could not be fetched in time';
  return 'it is not a valid signed JWT';
}

export function bearerAuthenticator(db: Db, config: JwtConfig | undefined): Authenticator {
  return async (req) => {
    const token = bearerToken(req);
    if (token === undefined) return undefined;
    if (!config) throw new HttpError(401, 'Bearer tokens are not accepted: this server has no JWT issuer configured.');
    let payload: Record<string, unknown>;
    try {
      const verified = await jwtVerify(token, config.key as KeyObject, {
        issuer: config.issuer,
        audience: config.audience,
        algorithms: config.algorithms,
        requiredClaims: ['exp', 'sub'],
        clockTolerance: 30,
      });
      payload = verified.payload as Record<string, unknown>;
    } catch (err) {
      throw new HttpError(401, `Invalid bearer token: ${reason(err)}.`);
    }
    const sub = payload.sub;
    const tenant = payload.tenant_id ?? payload.workspace_id;
    if (typeof sub !== 'string' || !sub || sub.length > 200) throw new HttpError(401, 'Invalid bearer token: its sub claim is not acceptable.');
    if (typeof tenant !== 'string' || !tenant) throw new HttpError(401, 'Invalid bearer token: it names no tenant_id (or workspace_id).');
    const ws = await db.get<{ id: string }>('SELECT id FROM workspaces WHERE id = ?', [tenant]);
    if (!ws) throw new HttpError(401, 'Invalid bearer token: its tenant is not a workspace of this server.');
    const user = await ensureUser(db, ws.id, sub);
    return { workspaceId: ws.id, userId: user.id, via: 'bearer' };
  };
}
