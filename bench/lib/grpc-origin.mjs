// The gRPC origin of the h2 phase (bench/lib/h2.mjs): a grpc-js server over TLS with the bench
// origin's certificate. One unary method, raw bytes (no protobuf schema): it answers 64 bytes, or,
// when the request says `echo`, the authorization metadata it received (the injection check).
// usage: node grpc-origin.mjs PORT CERT KEY
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { GRPC_SERVICE } from './grpc-service.mjs';

const [port, cert, key] = process.argv.slice(2);
const ANSWER = Buffer.alloc(64, 0x61);
const server = new grpc.Server();
server.addService(GRPC_SERVICE, {
  unary: (call, cb) => {
    if (call.request.toString() === 'echo') cb(null, Buffer.from(call.metadata.get('authorization').map(String).join(',')));
    else cb(null, ANSWER);
  },
});
server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createSsl(null, [{ private_key: readFileSync(key), cert_chain: readFileSync(cert) }]), (err) => {
  if (err) {
    process.stderr.write(`grpc origin: ${err.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`grpc origin listening on 127.0.0.1:${port}\n`);
});
process.on('SIGTERM', () => server.tryShutdown(() => process.exit(0)));
