// A Go service exposing net/http/pprof, for the agent's pull-mode test.
//
//	gosvc <listen addr>
//
// It burns CPU in main.burnCPU, allocates in main.allocate, and contends on
// a mutex and a channel so that every pprof endpoint has data.
package main

import (
	"log"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"sync"
	"time"
)

var sink []byte

//go:noinline
func burnCPU() uint64 {
	x := uint64(1)
	for i := uint64(0); i < 50_000_000; i++ {
		x = x*6364136223846793005 + i
	}
	return x
}

//go:noinline
func allocate() {
	for i := 0; i < 1000; i++ {
		sink = make([]byte, 4096)
	}
}

func contend(mu *sync.Mutex) {
	for {
		mu.Lock()
		time.Sleep(time.Millisecond)
		mu.Unlock()
	}
}

func main() {
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	go func() {
		for {
			burnCPU()
		}
	}()
	go func() {
		for {
			allocate()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var mu sync.Mutex
	for i := 0; i < 4; i++ {
		go contend(&mu)
	}
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}
