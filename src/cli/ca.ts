import { X509Certificate } from 'node:crypto';
import path from 'node:path';
import { ensureCa } from '../certs/ca.js';
import { sandboxEnv, writeCaBundle, writeJavaTrustStore } from '../certs/env.js';
import { ConfigFileError, readProxyConfigFile } from '../config/load.js';
import { parseCliArgs } from './args.js';
import { CliError } from './errors.js';

const USAGE = `usage: keygate ca init --certs DIR
       keygate ca env --certs DIR --proxy URL [--bundle FILE] [--config FILE] [--format sh|json|dotenv]
                      [--ca-path PATH] [--bundle-path PATH]

  init    create the proxy CA (ca.pem, ca-key.pem mode 0600) unless it exists; print its fingerprint
  env     print the environment a sandbox needs and write the CA bundle (system roots + CA)
          --bundle FILE       where to write the bundle (default DIR/ca-bundle.pem)
          --config FILE       proxy_config whose no_proxy goes into NO_PROXY
          --ca-path PATH      path of ca.pem as the sandbox sees it (default: the local path)
          --bundle-path PATH  path of the bundle as the sandbox sees it (default: the local path)
          --truststore-path PATH  path of the Java truststore (DIR/ca-truststore.p12, written when
                              keytool is installed) as the sandbox sees it (default: the local path)`;

function quoteSh(v: string): string {
  return `'${v.replace(/'/g, `'\\''`)}'`;
}

function quoteDotenv(v: string): string {
  return /^[A-Za-z0-9_./:,@+-]*$/.test(v) ? v : JSON.stringify(v);
}

export async function run(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (!sub || sub === '--help' || sub === '-h') {
    process.stdout.write(USAGE + '\n');
    return sub ? 0 : 2;
  }
  const { values } = parseCliArgs(
    {
      args: rest,
      options: {
        certs: { type: 'string', default: './certs' },
        proxy: { type: 'string' },
        bundle: { type: 'string' },
        config: { type: 'string' },
        format: { type: 'string', default: 'sh' },
        'ca-path': { type: 'string' },
        'bundle-path': { type: 'string' },
        'truststore-path': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    },
    USAGE,
  );
  if (values.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  const certs = values.certs!;
  if (sub === 'init') {
    const ca = await ensureCa(certs).catch((err: Error) => {
      throw new CliError(`certificate authority in ${certs}: ${err.message}`);
    });
    const cert = new X509Certificate(ca.certPem);
    process.stdout.write(`CA certificate: ${ca.certPath}\nCA key:         ${ca.keyPath} (keep private; never give it to a sandbox)\nsubject:        ${cert.subject.replace(/\n/g, ', ')}\nSHA-256:        ${cert.fingerprint256}\nvalid until:    ${cert.validTo}\n`);
    return 0;
  }
  if (sub !== 'env') throw new CliError(`unknown 'ca' sub-command '${sub}'\n${USAGE}`, 2);
  if (!values.proxy) throw new CliError(`--proxy URL is required\n${USAGE}`, 2);
  let proxyUrl: URL;
  try {
    proxyUrl = new URL(values.proxy);
  } catch {
    throw new CliError(`--proxy must be a URL such as http://keygate-proxy:3128`, 2);
  }
  if (proxyUrl.protocol !== 'http:') throw new CliError('--proxy must be an http:// URL (the proxy speaks plain HTTP to the sandbox)', 2);
  const format = values.format!;
  if (!['sh', 'json', 'dotenv'].includes(format)) throw new CliError('--format must be sh, json or dotenv', 2);
  let noProxy: string[] = [];
  if (values.config) {
    try {
      noProxy = readProxyConfigFile(values.config).no_proxy ?? [];
    } catch (err) {
      if (err instanceof ConfigFileError) throw new CliError(err.message);
      throw err;
    }
  }
  const ca = await ensureCa(certs).catch((err: Error) => {
    throw new CliError(`certificate authority in ${certs}: ${err.message}`);
  });
  const bundle = path.resolve(values.bundle ?? path.join(certs, 'ca-bundle.pem'));
  writeCaBundle(ca.certPem, bundle);
  // Java needs its own truststore (it ignores PEM bundles); without keytool, say so and go on.
  const trustStore = path.resolve(path.join(certs, 'ca-truststore.p12'));
  const haveTrustStore = await writeJavaTrustStore(ca.certPem, trustStore);
  if (!haveTrustStore) process.stderr.write('keygate: no keytool found: JAVA_TOOL_OPTIONS left out (install a JDK to get a Java truststore)\n');
  const env = sandboxEnv({
    proxyUrl: values.proxy.replace(/\/$/, ''),
    caCertPath: values['ca-path'] ?? path.resolve(ca.certPath),
    bundlePath: values['bundle-path'] ?? bundle,
    noProxy,
    javaTrustStorePath: haveTrustStore ? (values['truststore-path'] ?? trustStore) : undefined,
  });
  if (format === 'json') process.stdout.write(JSON.stringify(env, null, 2) + '\n');
  else if (format === 'dotenv') process.stdout.write(Object.entries(env).map(([k, v]) => `${k}=${quoteDotenv(v)}`).join('\n') + '\n');
  else process.stdout.write(Object.entries(env).map(([k, v]) => `export ${k}=${quoteSh(v)}`).join('\n') + '\n');
  return 0;
}
