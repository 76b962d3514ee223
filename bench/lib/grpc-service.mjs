// The one gRPC method the h2 phase calls, as raw bytes both ways (shared by origin and client).
const raw = (b) => b;
export const GRPC_SERVICE = {
  unary: { path: '/kgbench.Bench/Unary', requestStream: false, responseStream: false, requestSerialize: raw, requestDeserialize: raw, responseSerialize: raw, responseDeserialize: raw },
};
