// A Go workload for the server-side symbols tests: main -> outer ->
// inlined -> leaf (the last two inlined by the compiler); `chaingo
// <out.pprof>` spins for 3 s under runtime/pprof's CPU profiler and writes
// the profile.
package main

import (
	"os"
	"runtime/pprof"
	"time"
)

var sink uint64

func leaf(n uint64) uint64 {
	x := n
	for i := uint64(0); i < 3000000; i++ {
		x = x*6364136223846793005 + i
	}
	return x
}

func inlined(n uint64) uint64 { return leaf(n) ^ n }

//go:noinline
func outer(n uint64) uint64 { return inlined(n) + 1 }

func main() {
	f, _ := os.Create(os.Args[1])
	pprof.StartCPUProfile(f)
	t0 := time.Now()
	for time.Since(t0) < 3*time.Second {
		sink += outer(sink)
	}
	pprof.StopCPUProfile()
	f.Close()
}
