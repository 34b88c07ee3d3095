// Command clientgo is the client-go contender of bench/informer_bench.py: a namespace-scoped dynamic shared
// informer on ConfigMaps with a no-op handler, speaking the same line protocol as the Python runners.
//
// It prints one JSON object per line on stdout:
//
//	{"event":"baseline", ...}  after client setup, just before the informer starts
//	{"event":"synced", ...}    informer and handler synced (wall time, RSS, CPU)
//	{"event":"done", ...}      -mode updates only: after -updates update events (CPU, latency percentiles)
//
// In -mode updates it waits for a line "go" on stdin after "synced", so the CPU of the update phase excludes
// the initial sync and the idle time before the writers start.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// statusBytes reads a size field of /proc/self/status the same way the Python runners do.
func statusBytes(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field) {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kb * 1024
		}
	}
	return -1
}

// cpuSeconds is user+sys of the whole process (all threads), like resource.getrusage(RUSAGE_SELF) in Python.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func rssBytes() int64 { return statusBytes("VmRSS:") }

// maxRSSBytes is VmHWM: getrusage's Maxrss would include the parent's RSS at fork time.
func maxRSSBytes() int64 { return statusBytes("VmHWM:") }

func emit(m map[string]any) {
	b, _ := json.Marshal(m)
	fmt.Println(string(b))
}

func fail(format string, args ...any) {
	emit(map[string]any{"event": "error", "error": fmt.Sprintf(format, args...)})
	os.Exit(1)
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return -1
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch")
	mode := flag.String("mode", "sync", "sync | updates")
	expect := flag.Int("expect", 0, "objects in the namespace (for the report)")
	updates := flag.Int("updates", 0, "update events to wait for in -mode updates")
	dropManaged := flag.Bool("drop-managed-fields", false, "transform dropping metadata.managedFields (like ours by default)")
	timeoutSeconds := flag.Float64("timeout", 600, "give up on a phase after this many seconds")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (for diagnosis)")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail("cpuprofile: %v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail("cpuprofile: %v", err)
		}
		defer pprof.StopCPUProfile()
	}
	timeout := time.Duration(*timeoutSeconds * float64(time.Second))

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	// Default rest.Config settings (QPS/Burst, JSON): this is client-go as a controller gets it out of the box.
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dc, 0, *namespace, nil)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	informer := factory.ForResource(gvr).Informer()
	if *dropManaged {
		if err := informer.SetTransform(func(obj any) (any, error) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				u.SetManagedFields(nil)
			}
			return obj, nil
		}); err != nil {
			fail("transform: %v", err)
		}
	}

	var adds, updatesSeen, deletes atomic.Int64
	// Latencies are appended only by the handler goroutine (client-go calls one handler from one goroutine)
	// and read by main after `done` is closed, so no lock is needed.
	var latencies []float64
	var wantUpdates int64 = int64(*updates)
	done := make(chan struct{})
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { adds.Add(1) },
		UpdateFunc: func(oldObj, newObj any) {
			u, ok := newObj.(*unstructured.Unstructured)
			if !ok {
				return
			}
			ts, found, _ := unstructured.NestedString(u.Object, "data", "ts")
			if !found {
				return
			}
			sent, err := strconv.ParseFloat(ts, 64)
			if err != nil {
				return
			}
			latencies = append(latencies, float64(time.Now().UnixNano())/1e9-sent)
			if updatesSeen.Add(1) == wantUpdates {
				close(done)
			}
		},
		DeleteFunc: func(obj any) { deletes.Add(1) },
	})
	if err != nil {
		fail("handler: %v", err)
	}

	// Settle the heap before the baseline so it is not inflated by start-up garbage.
	runtime.GC()
	debug.FreeOSMemory()
	baseRSS, baseCPU := rssBytes(), cpuSeconds()
	emit(map[string]any{"event": "baseline", "rss": baseRSS, "cpu": baseCPU})

	stop := make(chan struct{})
	start := time.Now()
	factory.Start(stop)
	// Poll every millisecond rather than use cache.WaitForCacheSync, which polls every 100 ms and would round
	// the wall time up by as much (the Python runners are woken by an event at the exact moment).
	ok := false
	for deadline := start.Add(timeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if informer.HasSynced() && reg.HasSynced() {
			ok = true
			break
		}
	}
	wall := time.Since(start).Seconds()
	rss, cpu := rssBytes(), cpuSeconds()
	cached := len(informer.GetStore().ListKeys())
	// RSS once the garbage of the sync is returned to the OS: what the cache itself costs.
	runtime.GC()
	debug.FreeOSMemory()
	emit(map[string]any{
		"event": "synced", "ok": ok, "wall": wall, "rss": rss, "cpu": cpu, "objects": cached,
		"adds": adds.Load(), "expect": *expect, "rss_settled": rssBytes(), "maxrss": maxRSSBytes(),
	})
	if !ok {
		os.Exit(2)
	}
	if *mode != "updates" {
		close(stop)
		return
	}

	in := bufio.NewReader(os.Stdin)
	if line, _ := in.ReadString('\n'); strings.TrimSpace(line) != "go" {
		fail("expected go on stdin, got %q", line)
	}
	cpu0, t0 := cpuSeconds(), time.Now()
	emit(map[string]any{"event": "started"})
	timedOut := false
	select {
	case <-done:
	case <-time.After(timeout):
		timedOut = true
	}
	cpu1, elapsed := cpuSeconds(), time.Since(t0).Seconds()
	n := int(updatesSeen.Load())
	lat := append([]float64(nil), latencies[:min(n, len(latencies))]...)
	sort.Float64s(lat)
	emit(map[string]any{
		"event": "done", "timed_out": timedOut, "events": n, "cpu": cpu1 - cpu0, "elapsed": elapsed,
		"lat_p50": percentile(lat, 0.50), "lat_p99": percentile(lat, 0.99), "lat_max": percentile(lat, 1.0),
		"rss": rssBytes(),
	})
	close(stop)
}
