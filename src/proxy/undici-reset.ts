import type net from 'node:net';

/**
 * undici 7 takes an ECONNRESET on a connection whose answer is delimited by the end of the
 * connection (no Content-Length, not chunked) for the end of that answer: its client-h1.js
 * completes the message there ("On Mac OS, we get an ECONNRESET even if there is a full body to
 * be forwarded to the user"). So an origin's connection reset in the middle of such a body reached
 * the client as a complete answer, on every path undici reads for (the Node path, plain HTTP,
 * HTTP/2 clients' requests to HTTP/1.1 origins). A reset says the opposite of an end: the answer
 * is broken, and the client must see it broken (forward.ts cuts it).
 *
 * This 'error' listener runs before undici's (it is added when the connection is made, before
 * undici has the socket): in exactly undici's case (a reset while its parser is inside an answer
 * that ends with the connection), it renames the error's code, so undici fails the request
 * instead of completing it. Any other error, and any socket without undici's parser (the fast
 * path's, HTTP/2's), is left as it is. Remove when undici stops treating a reset as an end.
 */

/** The code a reset in the middle of a close-delimited answer is given (errors.ts reads it as a reset). */
export const RESET_IN_BODY = 'ECONNRESET_IN_BODY';

interface UndiciParser {
  statusCode: number | null;
  shouldKeepAlive: boolean;
}

/**
 * The HTTP/1 parser undici keeps on a connection it reads (under a symbol named `parser`: undici
 * exports neither), or undefined: not attached yet, none (the fast path's and HTTP/2 connections),
 * or undici's internals are not what this expects. Every workaround that has to reach undici's
 * parser (here and in upstream.ts) finds it through this.
 */
export function undiciParser<P>(socket: net.Socket): P | undefined {
  const sym = Object.getOwnPropertySymbols(socket).find((x) => x.description === 'parser');
  return sym ? ((socket as unknown as Record<symbol, P | null>)[sym] ?? undefined) : undefined;
}

export function guardResetInBody(socket: net.Socket): void {
  socket.prependListener('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'ECONNRESET') return;
    const parser = undiciParser<UndiciParser>(socket);
    if (!parser || !parser.statusCode || parser.shouldKeepAlive) return;
    err.code = RESET_IN_BODY;
  });
}
