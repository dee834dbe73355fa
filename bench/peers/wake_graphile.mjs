// graphile-worker's side of the wake-latency benchmark (bench/versus.py): an idle worker at
// graphile-worker's defaults whose task notes when it started.
//
//   node bench/peers/wake_graphile.mjs STAMPS [CONCURRENT_JOBS]
//
// Creates the database x_jobs_peer_graphile_wake[_CONCURRENT_JOBS] (dropped at the end: one per
// setting, so that bench/versus.py runs them side by side) and installs
// graphile-worker's schema with its own API (WorkerUtils.migrate), then runs one run() with only
// a connection string: the defaults (concurrentJobs 1, maxPoolSize 10, pollInterval 2000 ms; a
// LISTEN on "jobs:insert" wakes it when a job is added), but for concurrentJobs when
// CONCURRENT_JOBS is given (10: x_jobs' default concurrency). Prints "ready" once run() is up; the
// caller then adds jobs with graphile_worker.add_job('stamp', '{"n": N}') and reads STAMPS.
// On "stop" (or the end of stdin) it shuts down gracefully, drops the database and prints one
// JSON line with the settings.
//
// The task "stamp" first reads CLOCK_MONOTONIC (process.hrtime, the clock time.monotonic()
// reads in Python), then appends a line "n seconds" to STAMPS, as bench/apps/stamp.py does for
// x_jobs. Connections use libpq's environment (PGHOST, PGPORT, PGUSER), as run_graphile.mjs.

import { closeSync, openSync, readFileSync, writeSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const requireFromPeer = createRequire(join(here, "graphile", "package.json"));
const importPeer = (name) => import(pathToFileURL(requireFromPeer.resolve(name)).href);

const connectionString = (db) => `postgres:///${db}`;

const { default: pg } = await importPeer("pg");
const { makeWorkerUtils, run } = await importPeer("graphile-worker");

async function admin(statement) {
  const client = new pg.Client({ connectionString: connectionString("postgres") });
  await client.connect();
  try {
    await client.query(statement);
  } finally {
    await client.end();
  }
}

async function main(argv) {
  if (argv.length < 1 || argv.length > 2) {
    throw new Error("usage: wake_graphile.mjs STAMPS [CONCURRENT_JOBS]");
  }
  const concurrentJobs = argv.length > 1 ? Number(argv[1]) : undefined;
  if (concurrentJobs !== undefined && !(Number.isInteger(concurrentJobs) && concurrentJobs > 0)) {
    throw new Error(`CONCURRENT_JOBS must be a positive integer, not ${argv[1]}`);
  }
  const DBNAME = `x_jobs_peer_graphile_wake${concurrentJobs === undefined ? "" : `_${concurrentJobs}`}`;
  const stamps = openSync(argv[0], "a");
  await admin(`DROP DATABASE IF EXISTS ${DBNAME} WITH (FORCE)`);
  await admin(`CREATE DATABASE ${DBNAME}`);
  try {
    const utils = await makeWorkerUtils({ connectionString: connectionString(DBNAME) });
    try {
      await utils.migrate();
    } finally {
      await utils.release();
    }
    const runner = await run({
      connectionString: connectionString(DBNAME),
      ...(concurrentJobs === undefined ? {} : { concurrency: concurrentJobs }),
      noHandleSignals: true,
      taskList: {
        stamp: async (payload) => {
          const started = Number(process.hrtime.bigint()) / 1e9;
          writeSync(stamps, `${payload.n} ${started.toFixed(6)}\n`);
        },
      },
      parsedCronItems: [], // no cron: do not look for a crontab file in the working directory
    });
    const stop = new Promise((resolve) => {
      const lines = createInterface({ input: process.stdin });
      lines.on("line", (line) => line.trim() === "stop" && resolve());
      lines.on("close", resolve);
    });
    process.stdout.write(`ready ${DBNAME}\n`);
    const outcome = await Promise.race([
      stop.then(() => "stop"),
      runner.promise.then(() => "ended"),
    ]);
    if (outcome !== "stop") throw new Error("the worker ended before it was told to stop");
    await runner.stop();
  } finally {
    closeSync(stamps);
    // The runner's pool lets its connections go after stop() returns; a forced drop that came
    // first terminated one, and the pool's unhandled error ended this process with 1.
    for (let waited = 0; waited < 5000; waited += 50) {
      const client = new pg.Client({ connectionString: connectionString("postgres") });
      await client.connect();
      const { rows } = await client
        .query("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = $1", [DBNAME])
        .finally(() => client.end());
      if (Number(rows[0].n) === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await admin(`DROP DATABASE IF EXISTS ${DBNAME} WITH (FORCE)`);
  }
  const version = JSON.parse(
    readFileSync(join(dirname(requireFromPeer.resolve("graphile-worker")), "..", "package.json")),
  ).version;
  console.log(
    JSON.stringify({
      peer: "graphile-worker",
      settings:
        `graphile-worker ${version} on Node ${process.version}, one run() at its defaults ` +
        `(maxPoolSize 10, pollInterval 2000 ms, LISTEN "jobs:insert") with concurrentJobs ` +
        `${concurrentJobs ?? "1 (its default)"}, async task`,
    }),
  );
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`wake_graphile.mjs: ${err?.stack ?? err}`);
    process.exit(1);
  },
);
