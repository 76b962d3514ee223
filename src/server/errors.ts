import type { ValidationIssue } from '../validation/errors.js';

/** An error an API route wants answered as `{"detail": "sentence"}` with `status` (wire.md). */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
  ) {
    super(detail);
    this.name = 'HttpError';
  }
}

/** A 422 raised by route code (semantic checks after schema validation), with exact `loc`s. */
export class HttpValidationError extends Error {
  constructor(readonly issues: ValidationIssue[]) {
    super(issues.map((i) => i.msg).join('; '));
    this.name = 'HttpValidationError';
  }
}

export const notFound = (detail: string) => new HttpError(404, detail);
export const conflict = (detail: string) => new HttpError(409, detail);
export const forbidden = (detail: string) => new HttpError(403, detail);
export const badGateway = (detail: string) => new HttpError(502, detail);
export const unavailable = (detail: string) => new HttpError(503, detail);
