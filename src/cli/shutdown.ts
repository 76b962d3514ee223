/**
 * How every long-running keygate command stops: the first SIGTERM or SIGINT starts a graceful stop;
 * a repeated SIGTERM (supervisors such as Docker, systemd and Kubernetes resend it) never cuts the
 * drain short; a second SIGINT is a person at a terminal who does not want to wait, and exits 130.
 * Handlers stay installed until the process ends, so no later signal finds the default action.
 */
export function untilShutdown(onRepeat?: (signal: NodeJS.Signals) => void): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    let first: NodeJS.Signals | undefined;
    const on = (signal: NodeJS.Signals) => {
      if (first === undefined) {
        first = signal;
        resolve(signal);
        return;
      }
      onRepeat?.(signal);
      if (signal === 'SIGINT') process.exit(130);
    };
    process.on('SIGTERM', on);
    process.on('SIGINT', on);
  });
}
