/** Values and shapes shared by the control plane's modules (wire.md, "Control plane"). */

export const SOURCES = ['internal_source', 'external_docker', 'internal_docker'] as const;
export type Source = (typeof SOURCES)[number];

export const DEPLOYMENT_TYPES = ['dev', 'prod'] as const;
export type DeploymentType = (typeof DEPLOYMENT_TYPES)[number];

export const DEPLOYMENT_STATUSES = ['AWAITING_DATABASE', 'READY', 'UNUSED', 'AWAITING_DELETE', 'UNKNOWN'] as const;
export type DeploymentStatus = (typeof DEPLOYMENT_STATUSES)[number];

export const REVISION_STATUSES = [
  'CREATING',
  'QUEUED',
  'AWAITING_BUILD',
  'BUILDING',
  'AWAITING_DEPLOY',
  'DEPLOYING',
  'DEPLOYED',
  'CREATE_FAILED',
  'BUILD_FAILED',
  'DEPLOY_FAILED',
  'SKIPPED',
  'INTERRUPTED',
  'UNKNOWN',
] as const;
export type RevisionStatus = (typeof REVISION_STATUSES)[number];

/**
 * Secret names the runtime sets itself or that would break the app process: refused by the API
 * (422) and never sent by `keygate deploy` (which says so).
 */
export const RESERVED_SECRET_NAME = /^(KEYGATE_.*|PATH|HOME|PORT|NODE_OPTIONS|NODE_PATH|LD_PRELOAD|LD_LIBRARY_PATH)$/;

export const LOG_TYPES = ['build', 'deploy'] as const;
export type LogType = (typeof LOG_TYPES)[number];
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export interface SourceRevisionConfig {
  source_tarball_path?: string | null;
  image_uri?: string | null;
}

/** A deployment row as stored (secrets sealed, never opened here). */
export interface DeploymentRow {
  id: string;
  workspace_id: string;
  name: string;
  source: Source;
  deployment_type: DeploymentType;
  status: DeploymentStatus;
  latest_revision_id: string | null;
  active_revision_id: string | null;
  front_port: number | null;
  /** JSON `{name: sealed}`. */
  secrets: string;
  created_at: string;
  updated_at: string;
  seq: number;
}

export interface RevisionRow {
  id: string;
  deployment_id: string;
  workspace_id: string;
  status: RevisionStatus;
  status_message: string | null;
  source: Source;
  /** JSON of {@link SourceRevisionConfig}. */
  source_revision_config: string;
  /** JSON `{name: sealed}`: the deployment's secrets when the revision was created. */
  secrets: string;
  replaced_by: string | null;
  created_at: string;
  updated_at: string;
  seq: number;
}

export interface LogEntry {
  timestamp: string;
  type: LogType;
  revision_id: string | null;
  level: LogLevel;
  message: string;
}
