// A Node.js workload for the agent's JIT test: run with
// `node --perf-basic-prof hot.js <seconds>` so V8 writes /tmp/perf-<pid>.map.
function hotJsFunction(n) {
  let x = n;
  for (let i = 0; i < 5000000; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

const until = Date.now() + Number(process.argv[2] || 10) * 1000;
let n = 1;
while (Date.now() < until) {
  n = hotJsFunction(n);
}
console.log(n);
