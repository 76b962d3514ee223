// better-sqlite3 13 installed under an alias (package.json): the same API as better-sqlite3 12,
// whose types (@types/better-sqlite3) describe it. See src/store/db.ts for why both exist.
declare module 'better-sqlite3-napi' {
  import Database from 'better-sqlite3';
  export default Database;
}
