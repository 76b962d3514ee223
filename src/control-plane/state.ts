import type { RevisionStatus } from './types.js';

/**
 * The revision state machine. Pure: the manager asks before every status write, so an impossible
 * transition (e.g. a revision going back from DEPLOYED to BUILDING) is a bug that surfaces loudly
 * instead of a status that lies.
 */
const NEXT: Record<RevisionStatus, readonly RevisionStatus[]> = {
  CREATING: ['QUEUED', 'CREATE_FAILED'],
  QUEUED: ['BUILDING', 'SKIPPED', 'INTERRUPTED'],
  AWAITING_BUILD: ['BUILDING', 'SKIPPED', 'INTERRUPTED'],
  BUILDING: ['DEPLOYING', 'BUILD_FAILED', 'INTERRUPTED'],
  AWAITING_DEPLOY: ['DEPLOYING', 'INTERRUPTED'],
  DEPLOYING: ['DEPLOYED', 'DEPLOY_FAILED', 'INTERRUPTED'],
  DEPLOYED: [],
  CREATE_FAILED: [],
  BUILD_FAILED: [],
  DEPLOY_FAILED: [],
  SKIPPED: [],
  INTERRUPTED: [],
  UNKNOWN: [],
};

export const TERMINAL: ReadonlySet<RevisionStatus> = new Set(['DEPLOYED', 'CREATE_FAILED', 'BUILD_FAILED', 'DEPLOY_FAILED', 'SKIPPED', 'INTERRUPTED']);

/** Statuses of a revision a build/deploy worker is (or was, before a crash) working on. */
export const IN_PROGRESS: ReadonlySet<RevisionStatus> = new Set(['BUILDING', 'AWAITING_DEPLOY', 'DEPLOYING']);
export const WAITING: ReadonlySet<RevisionStatus> = new Set(['CREATING', 'QUEUED', 'AWAITING_BUILD']);

export function canTransition(from: RevisionStatus, to: RevisionStatus): boolean {
  return NEXT[from].includes(to);
}

export function isTerminal(s: RevisionStatus): boolean {
  return TERMINAL.has(s);
}

export class IllegalTransition extends Error {
  constructor(from: RevisionStatus, to: RevisionStatus) {
    super(`illegal revision transition ${from} -> ${to}`);
    this.name = 'IllegalTransition';
  }
}

/**
 * What a serve restart does with a revision that was not finished: the latest waiting revision is
 * simply built; an in-progress one is INTERRUPTED and, if it was the latest, replaced by a fresh
 * copy; anything older and unfinished is SKIPPED (a newer revision supersedes it).
 */
export function recoveryAction(status: RevisionStatus, isLatest: boolean): 'keep' | 'requeue' | 'skip' | 'interrupt' | 'interrupt-and-rebuild' {
  if (isTerminal(status)) return 'keep';
  if (WAITING.has(status)) return isLatest ? 'requeue' : 'skip';
  return isLatest ? 'interrupt-and-rebuild' : 'interrupt';
}
