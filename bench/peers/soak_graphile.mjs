// One graphile-worker worker with the settings of its performance page, for bench/soak.py.
//
//   node bench/peers/soak_graphile.mjs DBNAME
//
// Installs graphile-worker's schema in DBNAME (an existing, empty database) with its own API
// (WorkerUtils.migrate, as run_graphile.mjs does), then starts run() with nothing but the
// connection string, a no-op task "noop", no cron items and the settings run_graphile.mjs
// drains with (worker.graphile.org/docs/performance): at its defaults (one job at a time, no
// local queue) it does not keep 2,000 jobs/s on this machine (400-1,300 done/s, its backlog
// growing without end), and a soak of a worker that falls behind measures nothing of its steady
// state. Prints one JSON line once the worker runs, {"ready": true, "pid": ...,
// "settings": "..."}, then runs until "stop" arrives on stdin (or stdin ends) and stops
// gracefully. The producer is bench/soak.py, which calls graphile_worker.add_jobs in SQL.
//
// NO_LOG_SUCCESS=1, as graphile-worker's own perfTest sets, keeps it from printing a "Completed
// task" line per job (2,000 a second here); anything else it logs goes to stderr.
// Connections use libpq's environment (PGHOST, PGPORT, PGUSER), as in run_graphile.mjs.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const requireFromPeer = createRequire(join(here, "graphile", "package.json"));
const importPeer = (name) => import(pathToFileURL(requireFromPeer.resolve(name)).href);

async function main(argv) {
  if (argv.length !== 1) throw new Error("usage: soak_graphile.mjs DBNAME");
  const connectionString = `postgres:///${argv[0]}`;
  // The worker's log lines would mix with the JSON line on stdout.
  console.log = console.info = console.warn = console.error;
  process.env.NO_LOG_SUCCESS = "1";
  const { makeWorkerUtils, run } = await importPeer("graphile-worker");

  const utils = await makeWorkerUtils({ connectionString });
  try {
    await utils.migrate();
  } finally {
    await utils.release();
  }

  const stop = new Promise((resolve) => {
    const lines = createInterface({ input: process.stdin });
    lines.on("line", (line) => {
      if (line.trim() === "stop") resolve();
    });
    lines.on("close", resolve);
  });
  const settings = {
    concurrentJobs: 24,
    maxPoolSize: 25,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  };
  const runner = await run({
    // Through a preset, as run_graphile.mjs passes them: 0.18 ignores these as run() options.
    preset: { worker: { connectionString, ...settings } },
    noHandleSignals: true,
    taskList: { noop: async () => {} },
    parsedCronItems: [], // no cron: do not look for a crontab file in the working directory
  });

  const version = JSON.parse(
    readFileSync(join(dirname(requireFromPeer.resolve("graphile-worker")), "..", "package.json")),
  ).version;
  process.stdout.write(
    JSON.stringify({
      ready: true,
      pid: process.pid,
      settings:
        `graphile-worker ${version} on Node ${process.version}, one run() with its ` +
        `performance settings ${JSON.stringify(settings)}, NO_LOG_SUCCESS=1, async no-op task`,
    }) + "\n",
  );

  const outcome = await Promise.race([stop.then(() => "stop"), runner.promise.then(() => "ended")]);
  if (outcome === "stop") await runner.stop();
  if (outcome === "ended") throw new Error("the worker ended before it was told to stop");
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`soak_graphile.mjs: ${err?.stack ?? err}\n`);
    process.exit(1);
  },
);
