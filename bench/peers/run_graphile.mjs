// Drain a backlog of no-op jobs with graphile-worker's own worker pool, timed.
//
//   node bench/peers/run_graphile.mjs [--clock-marks] JOBS [WORKERS]
//
// Creates the database x_jobs_peer_graphile (dropped at the end), installs graphile-worker's
// schema with its own API (WorkerUtils.migrate), enqueues JOBS jobs with WorkerUtils.addJobs
// (10,000 a call; not timed), then times WORKERS processes, each running graphile-worker's
// run() with the settings of its performance page (concurrentJobs 24, maxPoolSize 25,
// localQueue.size 500, completeJobBatchDelay 0, failJobBatchDelay 0) and NO_LOG_SUCCESS=1 (as its
// own perfTest sets, so that 100,000 "Completed task" lines are not printed), until
// graphile_worker._private_jobs is empty (a completed job is deleted). Prints one JSON line.
//
// The drain is timed as in peerlib.py: the workers start, import graphile-worker, print "ready";
// the clock starts when "go" is written to all of them and stops when a poll of the jobs table
// finds it empty (the poll backs off while many jobs are left, comes every 5 ms near the end,
// and runs serially, without parallel workers); then the workers get "stop" (graceful shutdown).
//
// --clock-marks (bench/versus.py): right before the clock starts, print a line
// {"clock": "start", "pids": [the workers' process ids], "poller": the polling connection's
// backend pid} and wait for a line on stdin; right after it stops, {"clock": "stop", ...} and
// wait again. The caller samples CPU times there (the server's, the poll's backend's and the
// workers'), at the same moments of the drain as it does for x_jobs' own workers.
//
// graphile-worker is installed in bench/peers/graphile/node_modules by bench/peers/setup.
// 0.18.0 declares engines.node >= 22.18.0, so npm warns (EBADENGINE) on this machine's Node 20;
// it runs here all the same (tasks come from taskList, no task files are loaded).
// Connections use libpq's environment (PGHOST, PGPORT, PGUSER): "postgres:///DB" leaves host,
// port and user empty, and node-postgres fills them from those variables.

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const requireFromPeer = createRequire(join(here, "graphile", "package.json"));
const importPeer = (name) => import(pathToFileURL(requireFromPeer.resolve(name)).href);

const DBNAME = "x_jobs_peer_graphile";
const ENQUEUE_CHUNK = 10_000;
const USAGE = "usage: run_graphile.mjs [--clock-marks] JOBS [WORKERS]";
const connectionString = (db) => `postgres:///${db}`;

// The documented performance settings (worker.graphile.org/docs/performance).
const PERFORMANCE_PRESET = {
  worker: {
    connectionString: connectionString(DBNAME),
    concurrentJobs: 24,
    maxPoolSize: 25,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

const { default: pg } = await importPeer("pg");

async function admin(statement) {
  const client = new pg.Client({ connectionString: connectionString("postgres") });
  await client.connect();
  try {
    await client.query(statement);
  } finally {
    await client.end();
  }
}

async function withClient(db, fn) {
  const client = new pg.Client({ connectionString: connectionString(db) });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function count(client, sql) {
  const { rows } = await client.query(sql);
  return Number(rows[0].count);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function load(jobs) {
  const { makeWorkerUtils } = await importPeer("graphile-worker");
  const utils = await makeWorkerUtils({ connectionString: connectionString(DBNAME) });
  try {
    await utils.migrate();
    for (let start = 0; start < jobs; start += ENQUEUE_CHUNK) {
      const n = Math.min(ENQUEUE_CHUNK, jobs - start);
      const specs = Array.from({ length: n }, (_, i) => ({
        identifier: "noop",
        payload: { n: start + i },
      }));
      await utils.addJobs(specs);
    }
  } finally {
    await utils.release();
  }
}

// One worker process: "ready", wait for "go", run until "stop" (or the end of stdin).
async function work() {
  const { run } = await importPeer("graphile-worker");
  const lines = createInterface({ input: process.stdin });
  let goResolve;
  let stopResolve;
  const go = new Promise((resolve) => (goResolve = resolve));
  const stop = new Promise((resolve) => (stopResolve = resolve));
  let stopping = false;
  lines.on("line", (line) => {
    if (line.trim() === "go") goResolve();
    if (line.trim() === "stop") {
      stopping = true;
      goResolve();
      stopResolve();
    }
  });
  lines.on("close", () => {
    stopping = true;
    goResolve();
    stopResolve();
  });
  process.stdout.write("ready\n");
  await go;
  if (stopping) return;
  const runner = await run({
    preset: PERFORMANCE_PRESET,
    noHandleSignals: true,
    taskList: { noop: async () => {} },
    parsedCronItems: [], // no cron: do not look for a crontab file in the working directory
  });
  const outcome = await Promise.race([stop.then(() => "stop"), runner.promise.then(() => "ended")]);
  if (outcome === "stop") await runner.stop();
  lines.close();
}

// A clock mark for --clock-marks: the line on stdout, then the caller's answer on stdin (its
// samples are taken by then).
let answers;
async function clockMark(fields) {
  answers ??= createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  process.stdout.write(`${JSON.stringify(fields)}\n`);
  if ((await answers.next()).done) throw new Error("stdin closed at a clock mark");
}

async function timedDrain(jobs, workers, marks) {
  const children = [];
  for (let n = 0; n < workers; n++) {
    const child = spawn(process.execPath, [fileURLToPath(import.meta.url), "--worker", `${n}`], {
      stdio: ["pipe", "pipe", "inherit"],
      env: { ...process.env, NO_LOG_SUCCESS: "1" },
    });
    child.exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
    children.push(child);
  }
  try {
    for (const child of children) {
      const first = await new Promise((resolve) => {
        const rl = createInterface({ input: child.stdout });
        rl.once("line", (line) => {
          resolve(line.trim());
          rl.close();
        });
        rl.once("close", () => resolve(""));
      });
      if (first !== "ready") throw new Error(`worker said ${JSON.stringify(first)}, not "ready"`);
      // Anything else a worker prints (its log) goes to stderr, away from the JSON line.
      child.stdout.on("data", (chunk) => process.stderr.write(chunk));
    }
    return await withClient(DBNAME, async (client) => {
      // Serial polls, as in peerlib.py's wait_drained: no parallel workers beside the drain.
      await client.query("SET max_parallel_workers_per_gather = 0");
      const remainingSql = "SELECT count(*) FROM graphile_worker._private_jobs";
      const mark = (clock) =>
        clockMark({ clock, pids: children.map((c) => c.pid), poller: client.processID });
      if (marks) await mark("start");
      const started = performance.now();
      for (const child of children) child.stdin.write("go\n");
      let left = jobs;
      let lastProgress = started;
      for (;;) {
        // The query's snapshot is taken when it starts: an empty answer means the backlog was
        // drained by then.
        const now = performance.now();
        const remaining = await count(client, remainingSql);
        if (remaining === 0) {
          if (marks) await mark("stop");
          return (now - started) / 1000;
        }
        if (remaining < left) {
          left = remaining;
          lastProgress = now;
        } else if (now - lastProgress > 120_000) {
          throw new Error(`no progress for 120 s, ${left} jobs left`);
        }
        for (const child of children) {
          if (child.exitCode !== null || child.signalCode !== null) {
            throw new Error(`worker exited early (${child.exitCode ?? child.signalCode})`);
          }
        }
        const done = jobs - left;
        if (done > 0) {
          const expected = (left * (now - started)) / done;
          await sleep(Math.min(500, Math.max(5, expected / 3)));
        } else {
          await sleep(20);
        }
      }
    });
  } finally {
    for (const child of children) {
      if (child.exitCode === null) child.stdin.end("stop\n");
    }
    for (const child of children) {
      const timeout = sleep(60_000).then(() => "timeout");
      if ((await Promise.race([child.exited, timeout])) === "timeout") {
        child.kill("SIGKILL");
        await child.exited;
      }
    }
  }
}

async function main(argv) {
  if (argv[0] === "--worker") {
    await work();
    return 0;
  }
  const marks = argv[0] === "--clock-marks";
  if (marks) argv = argv.slice(1);
  if (argv.length < 1 || argv.length > 2) throw new Error(USAGE);
  const jobs = Number(argv[0]);
  const workers = argv.length > 1 ? Number(argv[1]) : 1;
  if (!Number.isInteger(jobs) || !Number.isInteger(workers) || jobs < 1 || workers < 1) {
    throw new Error(USAGE);
  }
  await admin(`DROP DATABASE IF EXISTS ${DBNAME} WITH (FORCE)`);
  await admin(`CREATE DATABASE ${DBNAME}`);
  let seconds;
  try {
    await load(jobs);
    const queued = await withClient(DBNAME, (c) =>
      count(c, "SELECT count(*) FROM graphile_worker._private_jobs"),
    );
    if (queued !== jobs) throw new Error(`enqueued ${queued} jobs, not ${jobs}`);
    await withClient(DBNAME, async (c) => {
      await c.query("VACUUM ANALYZE");
      await c.query("CHECKPOINT");
    });
    seconds = await timedDrain(jobs, workers, marks);
  } finally {
    await admin(`DROP DATABASE IF EXISTS ${DBNAME} WITH (FORCE)`);
  }
  const version = JSON.parse(
    readFileSync(join(dirname(requireFromPeer.resolve("graphile-worker")), "..", "package.json")),
  ).version;
  const w = PERFORMANCE_PRESET.worker;
  console.log(
    JSON.stringify({
      peer: "graphile-worker",
      jobs,
      workers,
      seconds: Math.round(seconds * 1000) / 1000,
      jobs_per_s: Math.round((jobs / seconds) * 10) / 10,
      settings:
        `graphile-worker ${version} on Node ${process.version}, run() per process with ` +
        `concurrentJobs=${w.concurrentJobs}, maxPoolSize=${w.maxPoolSize}, ` +
        `localQueue.size=${w.localQueue.size}, completeJobBatchDelay=${w.completeJobBatchDelay}, ` +
        `failJobBatchDelay=${w.failJobBatchDelay}, NO_LOG_SUCCESS=1, async no-op task; ` +
        `enqueued with WorkerUtils.addJobs, ${ENQUEUE_CHUNK.toLocaleString("en")} a call`,
    }),
  );
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`run_graphile.mjs: ${err?.stack ?? err}`);
    process.exit(1);
  },
);
