import type { Area } from './area.js';

/** The areas, in registration order. Each area adds its import and entry here. */
export async function loadAreas(): Promise<Area[]> {
  const areas: Area[] = [];
  areas.push((await import('../auth/area.js')).authArea);
  areas.push((await import('../sandbox-api/area.js')).sandboxArea);
  areas.push((await import('../control-plane/area.js')).controlPlaneArea);
  return areas;
}
