// A Node.js workload for the agent's JIT test: run with
// `node --perf-basic-prof hot.js <seconds>` so V8 writes /tmp/perf-<pid>.map.
function hotJsFunction(n) {
  let x = n;
  for (let i = 0; i < 5000000; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

// Runs until the process has had <seconds> of CPU time (not wall time: a
// profiler's samples follow the CPU a process gets, so a loaded machine
// only makes the run longer). process.cpuUsage() is in microseconds.
const budget = Number(process.argv[2] || 10) * 1e6;
const cpu = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};
const start = cpu(); // relative: CPU time carries over an exec
let n = 1;
while (cpu() - start < budget) {
  n = hotJsFunction(n);
}
console.log(n);
