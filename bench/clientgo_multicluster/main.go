// Command clientgo_multicluster is the client-go peer of bench/multicluster_bench.py: kubeconfig Secrets on a
// management cluster select the member clusters, and each member gets a dynamic shared informer factory of its
// own with informers on the benchmark's GVRs, plus a work queue and workers (a minimal controller). It is what a
// hand-written client-go fleet controller does; multicluster-runtime's kubeconfig provider follows the same shape
// (a Secret informer, one cache per cluster, controllers engaged once the cache is synced).
//
// It prints one JSON object per line on stdout, times as Unix seconds (the harness compares them with its own):
//
//	{"event":"started","t":...}                    the Secret informer has synced
//	{"event":"synced","cluster":"...","t":...}     a member's informers have synced (its workers start)
//	{"event":"reconciled","cluster":"...","t":...} a member's first reconcile
//	{"event":"removed","cluster":"...","t":...}    a member's Secret is gone and the member stopped
//	{"event":"seen","cluster":"...","gvr":"...","name":"...","t":...}
//	                                              with -probe-prefix: an object so named was added or updated
//
// With -commands it reads one command a line on stdin (bench/storm_bench.py) and answers on stdout:
//
//	stats  {"event":"stats","cluster":"...","requests":n,"answered":n,"lists":{"<path>":n},"watches":n} a member
//	       each: every request its transport sent (answered: a response came), LISTs (and watch-list
//	       streams) by path, plain WATCHes;
//	       then {"event":"stats-done"}
//	dump   {"event":"dump","cluster":"...","gvr":"...","n":n,"digest":"..."} per member and GVR, the sha256 of
//	       its cache's sorted "namespace/name=resourceVersion" lines; then {"event":"dump-done"}
//
// Every member gets its own HTTP transport (so its own connection), as members on distinct API servers would:
// client-go shares one transport between configs with identical TLS settings, which here (every member is the
// same API server) would put all members on one HTTP/2 connection, unlike any real fleet.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

var out sync.Mutex

func emit(m map[string]any) {
	b, _ := json.Marshal(m)
	out.Lock()
	fmt.Println(string(b))
	out.Unlock()
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func fail(format string, args ...any) {
	emit(map[string]any{"event": "error", "error": fmt.Sprintf(format, args...)})
	os.Exit(1)
}

func parseGVR(s string) schema.GroupVersionResource {
	// group/version/resource, the core group written as an empty group: /v1/configmaps
	p := strings.Split(s, "/")
	if len(p) != 3 {
		fail("bad GVR %q", s)
	}
	return schema.GroupVersionResource{Group: p[0], Version: p[1], Resource: p[2]}
}

type member struct {
	name   string
	data   string
	cancel context.CancelFunc
	done   chan struct{}
	counts counts
	mu     sync.Mutex
	stores map[string]cache.Store // by GVR, once started
}

// counts are the requests one member's transport sent.
type counts struct {
	mu                          sync.Mutex
	requests, answered, watches int
	lists                       map[string]int
}

type countingTransport struct {
	next http.RoundTripper
	c    *counts
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	c := t.c
	c.mu.Lock()
	c.requests++
	if err == nil {
		c.answered++
	}
	query := req.URL.Query()
	if w := query.Get("watch"); (w == "true" || w == "1") && query.Get("sendInitialEvents") != "true" {
		c.watches++
	} else if req.Method == http.MethodGet {
		if c.lists == nil {
			c.lists = map[string]int{}
		}
		c.lists[req.URL.Path]++
	}
	c.mu.Unlock()
	return resp, err
}

func digest(store cache.Store) (int, string) {
	var lines []string
	for _, obj := range store.List() {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			lines = append(lines, u.GetNamespace()+"/"+u.GetName()+"="+u.GetResourceVersion())
		}
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return len(lines), hex.EncodeToString(sum[:])
}

func dropManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
	}
	return obj, nil
}

// run brings one member up and keeps it until ctx is cancelled.
func run(ctx context.Context, m *member, gvrs []schema.GroupVersionResource, workers int, probePrefix string) {
	defer close(m.done)
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(m.data))
	if err != nil {
		emit(map[string]any{"event": "error", "cluster": m.name, "error": err.Error()})
		return
	}
	// A dialer of its own makes the config uncacheable in client-go's TLS transport cache: one transport (one
	// HTTP/2 connection) per member, as with distinct API servers.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = dialer.DialContext
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &countingTransport{rt, &m.counts} }
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		emit(map[string]any{"event": "error", "cluster": m.name, "error": err.Error()})
		return
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
		DeleteFunc: enqueue,
	}
	var regs []cache.ResourceEventHandlerRegistration
	stores := map[string]cache.Store{}
	for _, gvr := range gvrs {
		inf := factory.ForResource(gvr).Informer()
		_ = inf.SetTransform(dropManagedFields)
		reg, err := inf.AddEventHandler(handler)
		if err != nil {
			fail("handler: %v", err)
		}
		regs = append(regs, reg)
		stores[gvr.Resource] = inf.GetStore()
		if probePrefix != "" {
			name := gvr.Resource
			seen := func(obj any) {
				if u, ok := obj.(*unstructured.Unstructured); ok && strings.HasPrefix(u.GetName(), probePrefix) {
					emit(map[string]any{"event": "seen", "cluster": m.name, "gvr": name, "name": u.GetName(), "t": now()})
				}
			}
			if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc: seen, UpdateFunc: func(_, n any) { seen(n) },
			}); err != nil {
				fail("handler: %v", err)
			}
		}
	}
	m.mu.Lock()
	m.stores = stores
	m.mu.Unlock()
	factory.Start(ctx.Done())
	syncedFns := make([]cache.InformerSynced, 0, len(regs))
	for _, r := range regs {
		syncedFns = append(syncedFns, r.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncedFns...) {
		queue.ShutDown()
		factory.Shutdown()
		return
	}
	emit(map[string]any{"event": "synced", "cluster": m.name, "t": now()})
	var first sync.Once
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				key, shutdown := queue.Get()
				if shutdown {
					return
				}
				first.Do(func() { emit(map[string]any{"event": "reconciled", "cluster": m.name, "t": now()}) })
				queue.Forget(key)
				queue.Done(key)
			}
		}()
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
	factory.Shutdown()
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the management cluster")
	namespace := flag.String("namespace", "", "namespace of the kubeconfig Secrets")
	selector := flag.String("selector", "kube-syncer.io/kubeconfig=true", "label selector of the kubeconfig Secrets")
	gvrList := flag.String("gvrs", "/v1/configmaps", "comma-separated group/version/resource list per member")
	workers := flag.Int("workers", 2, "workers per member")
	probePrefix := flag.String("probe-prefix", "", "emit a seen event for objects whose name starts with this")
	commands := flag.Bool("commands", false, "answer stats/dump commands read from stdin")
	flag.Parse()

	var gvrs []schema.GroupVersionResource
	for _, s := range strings.Split(*gvrList, ",") {
		gvrs = append(gvrs, parseGVR(s))
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(*namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = *selector }))
	secrets := factory.Core().V1().Secrets().Informer()

	var mu sync.Mutex
	members := map[string]*member{}
	stopMember := func(m *member) {
		m.cancel()
		<-m.done
	}
	upsert := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		data := string(s.Data["kubeconfig"])
		mu.Lock()
		defer mu.Unlock()
		if old, ok := members[s.Name]; ok {
			if old.data == data {
				return
			}
			stopMember(old)
		}
		ctx, cancel := context.WithCancel(context.Background())
		m := &member{name: s.Name, data: data, cancel: cancel, done: make(chan struct{})}
		members[s.Name] = m
		go run(ctx, m, gvrs, *workers, *probePrefix)
	}
	remove := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		mu.Lock()
		m, ok := members[s.Name]
		delete(members, s.Name)
		mu.Unlock()
		if ok {
			go func() {
				stopMember(m)
				emit(map[string]any{"event": "removed", "cluster": m.name, "t": now()})
			}()
		}
	}
	if _, err := secrets.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: upsert, UpdateFunc: func(_, n any) { upsert(n) }, DeleteFunc: remove,
	}); err != nil {
		fail("handler: %v", err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, secrets.HasSynced) {
		fail("secret informer did not sync")
	}
	emit(map[string]any{"event": "started", "t": now()})
	if *commands {
		answer(&mu, members)
	}
	select {}
}

// answer serves the -commands protocol (see the top of the file) until stdin ends.
func answer(mu *sync.Mutex, members map[string]*member) {
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		mu.Lock()
		all := make([]*member, 0, len(members))
		for _, m := range members {
			all = append(all, m)
		}
		mu.Unlock()
		switch strings.TrimSpace(scanner.Text()) {
		case "stats":
			for _, m := range all {
				c := &m.counts
				c.mu.Lock()
				lists := map[string]int{}
				for k, v := range c.lists {
					lists[k] = v
				}
				emit(map[string]any{"event": "stats", "cluster": m.name, "requests": c.requests,
					"answered": c.answered, "watches": c.watches, "lists": lists})
				c.mu.Unlock()
			}
			emit(map[string]any{"event": "stats-done"})
		case "dump":
			for _, m := range all {
				m.mu.Lock()
				stores := m.stores
				m.mu.Unlock()
				for gvr, store := range stores {
					n, d := digest(store)
					emit(map[string]any{"event": "dump", "cluster": m.name, "gvr": gvr, "n": n, "digest": d})
				}
			}
			emit(map[string]any{"event": "dump-done"})
		}
	}
}
