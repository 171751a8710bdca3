// backstop-policy/redis on a real 3-master Redis Cluster: the scripts through
// the cluster clients, which route every command by the queue's hash tag.
import { after } from 'node:test';
import { cluster, inspector } from '../test-support/clients.js';
import { scriptSuite } from '../test-support/queue-suite.js';
import { startCluster } from '../test-support/redis-server.js';

const servers = await startCluster(3);
const raw = inspector(servers.nodes);
// A command to every master (SCRIPT FLUSH, CONFIG RESETSTAT, INFO).
const each = (...args) => Promise.all(raw.client.nodes('master').map((node) => node.call(...args)));
after(async () => {
  await raw.close();
  await servers.stop();
});

for (const [name, kind] of Object.entries(cluster)) {
  scriptSuite(name, kind, servers.nodes, () => ({ raw, each }));
}
