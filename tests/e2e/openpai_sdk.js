// Drives Trainyard with OpenPAI's own JavaScript SDK (@microsoft/openpai-js-sdk, pinned in
// tools/js), unchanged: every call of its job (tags too), job history, cluster info,
// virtual cluster, user, group, token, storage and authn clients. Prints one JSON object: each call's answer, or its error status.
// Usage: node openpai_sdk.js <rest server URL> <token> <user> <job name> <queue>
const path = require('path');
const { PAIV1, PAIV2 } = require(path.join(__dirname, '..', '..', 'tools', 'js', 'node_modules',
  '@microsoft', 'openpai-js-sdk'));

const [url, token, user, name, queue] = process.argv.slice(2);
const client = new PAIV2.OpenPAIClient({ rest_server_uri: url, token, username: user });

async function call(fn) {
  try {
    return { ok: await fn() };
  } catch (err) {
    const response = err.response || {};
    return { status: response.status || err.status || null, data: response.data || String(err) };
  }
}

function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

(async () => {
  const out = {};
  const job = {
    protocolVersion: 2,
    name,
    type: 'job',
    prerequisites: [{ type: 'dockerimage', uri: 'python:3.11', name: 'image' }],
    taskRoles: {
      worker: {
        instances: 2,
        dockerImage: 'image',
        resourcePerInstance: { cpu: 1, memoryMB: 512, gpu: 0 },
        commands: ['echo hello from $PAI_CURRENT_TASK_ROLE_NAME $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX'],
      },
    },
    defaults: { virtualCluster: queue },
  };
  out.create = await call(() => client.job.createJob(job));
  // Read at once: OpenPAI finds a job right after its 202.
  out.firstGet = await call(() => client.job.getJob(user, name));
  out.createAgain = await call(() => client.job.createJob(job));
  let state = null;
  for (let i = 0; i < 240 && !['SUCCEEDED', 'FAILED', 'STOPPED'].includes(state); i++) {
    const got = await call(() => client.job.getJob(user, name));
    state = got.ok ? got.ok.jobStatus.state : null;
    if (!['SUCCEEDED', 'FAILED', 'STOPPED'].includes(state)) await sleep(250);
  }
  out.job = await call(() => client.job.getJob(user, name));
  out.attempt = await call(() => client.job.getJob(user, name, 0));
  out.missingAttempt = await call(() => client.job.getJob(user, name, 7));
  out.config = await call(() => client.job.getJobConfig(user, name));
  out.list = await call(() => client.job.listJobs({ username: user }));
  out.task = await call(() => client.job.getTask(user, name, 0, 'worker', 1));
  out.missingTask = await call(() => client.job.getTask(user, name, 0, 'worker', 5));
  out.taskLogs = await call(() => client.job.getTaskLogs(user, name, 0, 'worker', 1, 0));
  out.events = await call(() => client.job.listEvents(user, name));
  out.attemptsHealthz = await call(() => client.jobHistory.getJobAttemptsHealthz(user, name));
  out.attempts = await call(() => client.jobHistory.getJobAttempts(user, name));
  out.attemptZero = await call(() => client.jobHistory.getJobAttempt(user, name, 0));
  out.info = await call(() => client.api.getClusterInfo());
  out.virtualClusters = await call(() => client.virtualCluster.listVirtualClusters());
  out.virtualCluster = await call(() => client.virtualCluster.getVirtualCluster(queue));
  out.missingVirtualCluster = await call(() => client.virtualCluster.getVirtualCluster('nope'));
  out.skuTypes = await call(() => client.virtualCluster.getVirtualClusterSkuTypes(queue));
  out.addTag = await call(() => client.job.addTag(user, name, 'nightly'));
  await call(() => client.job.addTag(user, name, 'keep'));
  out.tagged = await call(() => client.job.getJob(user, name));
  out.listTagged = await call(() => client.job.listJobs({ tagsContain: 'nightly' }));
  out.listNotTagged = await call(() => client.job.listJobs({ tagsNotContain: 'nightly,other' }));
  out.listKeyword = await call(() => client.job.listJobs({ keyword: name.slice(3, 10) }));
  out.listNoKeyword = await call(() => client.job.listJobs({ keyword: name + '-x' }));
  out.listOrdered = await call(() => client.job.listJobs({ order: 'jobName,ASC' }));
  out.deleteTag = await call(() => client.job.deleteTag(user, name, 'nightly'));
  out.untagged = await call(() => client.job.getJob(user, name));
  out.tagMissingJob = await call(() => client.job.addTag(user, name + '-none', 'x'));
  // Accounts: users, groups, tokens, storages.
  out.me = await call(() => client.user.getUser(user));
  out.users = await call(() => client.user.getAllUser());
  out.missingUser = await call(() => client.user.getUser('nobody-here'));
  out.createUser = await call(() => client.user.createUser({ username: 'x', password: 'secret1' }));
  out.updateUser = await call(() => client.user.updateUser({ username: user, email: 'a@b' }));
  out.updateSelf = await call(() => client.user.updateUserSelf({ email: 'a@b' }));
  out.deleteUser = await call(() => client.user.deleteUser('x'));
  out.userGroup = await call(() => client.user.updateUserGroup(user, 'g'));
  out.deleteUserGroup = await call(() => client.user.deleteUserGroup(user, 'g'));
  out.userGrouplist = await call(() => client.user.updateUserGrouplist(user, ['g']));
  out.groups = await call(() => client.group.getAllGroup());
  out.group = await call(() => client.group.getGroup('admingroup'));
  out.missingGroup = await call(() => client.group.getGroup('nope'));
  out.members = await call(() => client.group.getGroupMembers('default'));
  out.createGroup = await call(() => client.group.createGroup({ groupname: 'g' }));
  out.updateGroup = await call(() => client.group.updateGroup({ groupname: 'g' }));
  out.deleteGroup = await call(() => client.group.deleteGroup('g'));
  out.tokens = await call(() => client.token.getTokens());
  out.appToken = await call(() => client.token.createApplicationToken());
  if (out.appToken.ok) {
    const app = new PAIV2.OpenPAIClient({ rest_server_uri: url, token: out.appToken.ok.token, username: user });
    out.withAppToken = await call(() => app.job.getJob(user, name));
    out.appTokens = await call(() => app.token.getTokens());
    out.revoke = await call(() => client.token.deleteToken(out.appToken.ok.token));
    out.afterRevoke = await call(() => app.token.getTokens());
  }
  out.basicLogin = await call(() => client.authn.basicLogin(user, 'password'));
  out.basicLogout = await call(() => client.authn.basicLogout());
  out.oidcLogin = await call(() => client.authn.oidcLogin());
  out.storages = await call(() => client.storage.getStorages());
  out.missingStorage = await call(() => client.storage.getStorage('nfs'));
  out.stop = await call(() => client.job.updateJobExecutionType(user, name, 'STOP'));
  out.missingJob = await call(() => client.job.getJob(user, name + '-none'));
  // The SDK's v1 client: its stop goes to /api/v1/user/{user}/jobs/{name}/executionType,
  // which OpenPAI's rest-server rewrites to the v2 route.
  const v1 = new PAIV1.OpenPAIClient({ rest_server_uri: url, token, username: user });
  out.v1Stop = await call(() => v1.job.execute(user, name, 'STOP'));
  console.log(JSON.stringify(out));
})().catch((err) => { console.error(err); process.exit(1); });
