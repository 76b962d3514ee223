import type { FastifyRequest } from 'fastify';
import { credentialStillValid } from './auth.js';
import { intSetting } from '../settings.js';

/** Default interval of a long-lived stream's heartbeat (SSE comment, WebSocket check). */
export const DEFAULT_STREAM_HEARTBEAT_MS = 10_000;

/** `KEYGATE_STREAM_HEARTBEAT_MS`: how often long-lived streams beat and re-check their caller. */
export function streamHeartbeatMs(env: NodeJS.ProcessEnv): number {
  return intSetting(env, 'KEYGATE_STREAM_HEARTBEAT_MS', DEFAULT_STREAM_HEARTBEAT_MS, { min: 100, max: 600_000, unit: 'milliseconds' });
}

export const CREDENTIAL_GONE = 'The credential this stream was opened with is no longer valid (the API key was deleted or the token expired).';

export interface StreamGuard {
  /** Runs at every heartbeat, before the checks (writes the heartbeat itself). */
  beat?: () => void;
  /** Throws (an HttpError: 404) when what the stream follows is gone. */
  stillThere: () => Promise<unknown>;
  /** Called once, with the sentence saying why, when the stream must end. */
  end: (detail: string) => void;
}

/**
 * A long-lived stream is authorised for as long as it runs, not only when it opens: at every
 * heartbeat its credential is authenticated again and what it follows looked up again; when
 * either fails the stream is ended (fail closed: an error in the check ends it too). Returns the
 * function that stops the guard (call it when the stream ends for any other reason).
 */
export function guardStream(req: FastifyRequest, intervalMs: number, g: StreamGuard): () => void {
  let checking = false;
  let stopped = false;
  const stop = () => {
    stopped = true;
    clearInterval(timer);
  };
  const timer = setInterval(() => {
    if (checking || stopped) return;
    checking = true;
    g.beat?.();
    void (async () => {
      let why: string | undefined;
      if (!(await credentialStillValid(req))) why = CREDENTIAL_GONE;
      else {
        try {
          await g.stillThere();
        } catch (err) {
          why = err instanceof Error && 'detail' in err && typeof err.detail === 'string' ? err.detail : 'The stream cannot continue.';
        }
      }
      checking = false;
      if (why !== undefined && !stopped) {
        stop();
        g.end(why);
      }
    })();
  }, intervalMs);
  return stop;
}
