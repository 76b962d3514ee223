/**
 * gRPC end to end through interception (issue #19): a grpc-js client using keygate as its
 * CONNECT proxy (`grpc_proxy`), a grpc-js server over TLS with the test CA, the rule injecting
 * `authorization` metadata. Unary and bidirectional streaming calls, with `grpc-status` and
 * `grpc-message` trailers intact (an error status included), and the client's own
 * `authorization` replaced. Messages are raw bytes (no protobuf schema needed).
 */
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPki } from '../helpers/pki.js';
import { spawnProxy, type SpawnedProxy } from '../helpers/proxy.js';
import { SECRET } from './fixture.js';

const HOST = 'grpc.test.local';
const raw = { serialize: (b: Buffer) => b, deserialize: (b: Buffer) => b };
const SERVICE = {
  unary: { path: '/kg.Echo/Unary', requestStream: false, responseStream: false, requestSerialize: raw.serialize, requestDeserialize: raw.deserialize, responseSerialize: raw.serialize, responseDeserialize: raw.deserialize },
  fail: { path: '/kg.Echo/Fail', requestStream: false, responseStream: false, requestSerialize: raw.serialize, requestDeserialize: raw.deserialize, responseSerialize: raw.serialize, responseDeserialize: raw.deserialize },
  bidi: { path: '/kg.Echo/Bidi', requestStream: true, responseStream: true, requestSerialize: raw.serialize, requestDeserialize: raw.deserialize, responseSerialize: raw.serialize, responseDeserialize: raw.deserialize },
} satisfies grpc.ServiceDefinition;

type EchoClient = grpc.Client & {
  unary(req: Buffer, md: grpc.Metadata, cb: (err: grpc.ServiceError | null, res?: Buffer) => void): grpc.ClientUnaryCall;
  fail(req: Buffer, md: grpc.Metadata, cb: (err: grpc.ServiceError | null, res?: Buffer) => void): grpc.ClientUnaryCall;
  bidi(md: grpc.Metadata): grpc.ClientDuplexStream<Buffer, Buffer>;
};

let server: grpc.Server;
let port: number;
let proxy: SpawnedProxy;
let client: EchoClient;
const savedEnv = { grpc_proxy: process.env.grpc_proxy, no_grpc_proxy: process.env.no_grpc_proxy };

const auths = (md: grpc.Metadata) => md.get('authorization').map(String);

beforeAll(async () => {
  const pki = await createTestPki([HOST]);
  server = new grpc.Server();
  server.addService(SERVICE, {
    unary: (call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
      cb(null, Buffer.from(JSON.stringify({ auth: auths(call.metadata), msg: call.request.toString() })));
    },
    fail: (_call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) => {
      cb({ code: grpc.status.NOT_FOUND, details: 'no such thing' });
    },
    bidi: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      const auth = auths(call.metadata).join(',');
      call.on('data', (d: Buffer) => call.write(Buffer.from(`${auth}|${d.toString()}`)));
      call.on('end', () => call.end());
    },
  });
  port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createSsl(null, [{ private_key: Buffer.from(pki.keyPem), cert_chain: Buffer.from(pki.certPem) }]), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const config = { rules: [{ name: 'grpc', match_hosts: [HOST], headers: [{ name: 'Authorization', type: 'workspace_secret', value: 'Bearer {API_TOKEN}' }] }] };
  proxy = await spawnProxy({ config, secrets: { API_TOKEN: SECRET }, resolve: [`${HOST}:${port}:127.0.0.1`], upstreamCa: [pki.caPem] });
  // grpc-js reads its proxy from the environment when a channel is made.
  process.env.grpc_proxy = proxy.url;
  delete process.env.no_grpc_proxy;
  const Ctor = grpc.makeGenericClientConstructor(SERVICE, 'Echo');
  client = new Ctor(`${HOST}:${port}`, grpc.credentials.createSsl(Buffer.from(proxy.caPem))) as unknown as EchoClient;
});

afterAll(async () => {
  client?.close();
  for (const [k, v] of Object.entries(savedEnv)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  const output = proxy?.output() ?? '';
  await proxy?.stop();
  server?.forceShutdown();
  expect(output).not.toContain(SECRET);
});

const md = () => {
  const m = new grpc.Metadata();
  m.set('authorization', 'client-value');
  return m;
};

describe('gRPC through interception', () => {
  it('a unary call gets the injected authorization, replacing the client\'s', async () => {
    const res = await new Promise<Buffer>((resolve, reject) => client.unary(Buffer.from('hello'), md(), (err, r) => (err ? reject(err) : resolve(r!))));
    expect(JSON.parse(res.toString())).toEqual({ auth: [`Bearer ${SECRET}`], msg: 'hello' });
    await expect.poll(() => proxy.logs().some((l) => l.type === 'request' && l.proto === 'h2' && l.path === '/kg.Echo/Unary' && l.status === 200)).toBe(true);
  });

  it('an error status comes back intact in the trailers (grpc-status, grpc-message)', async () => {
    const err = await new Promise<grpc.ServiceError>((resolve) => client.fail(Buffer.from('x'), md(), (e) => resolve(e!)));
    expect(err.code).toBe(grpc.status.NOT_FOUND);
    expect(err.details).toBe('no such thing');
  });

  it('bidirectional streaming: each message answered before the next is sent, then a clean end', async () => {
    const call = client.bidi(md());
    const next = () => new Promise<string>((resolve) => call.once('data', (d: Buffer) => resolve(d.toString())));
    for (const word of ['one', 'two', 'three']) {
      const answer = next();
      call.write(Buffer.from(word));
      expect(await answer).toBe(`Bearer ${SECRET}|${word}`);
    }
    const status = new Promise<grpc.StatusObject>((resolve) => call.on('status', resolve));
    call.end();
    call.resume();
    expect((await status).code).toBe(grpc.status.OK);
  });
});
