// oidc-provider ships no type declarations; the tests use it loosely through this shim.
declare module 'oidc-provider';
