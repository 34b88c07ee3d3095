// Command clientgo_cached is the client-go peer of bench/cached_bench.py: it replicates the ConfigMaps of a
// source cluster that match a label selector into CachedObject wrappers (cache.kcp.io/v1alpha1) on a cache
// cluster, the way syncer/builtin/cached_resources/replication.py does (and kcp's replication controller does):
//
//   - a dynamic informer on the source ConfigMaps (all namespaces, managedFields dropped);
//   - a dynamic informer on the cache's CachedObjects filtered by the schema label (v1.configmaps.core);
//   - a rate-limited work queue of source keys fed by both (a wrapper maps back to its source by its labels);
//   - workers that create, update (only when the spec or one of our labels/annotations differs) or delete the
//     wrapper, named, labelled and annotated as naming.py does, through the dynamic (unstructured) client.
//
// Written for the benchmark; it handles what the benchmark exercises (one source cluster, namespaced objects).
//
// Protocol on stdout, one JSON object per line, times as Unix seconds:
//
//	{"event":"ready"}                  clients built, nothing started; waits for "go" on stdin
//	{"event":"begin","t":...}          "go" read: informers starting
//	{"event":"synced","t":...}         both informers synced, workers running
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

const (
	labelSchema            = "cache.kcp.io/object-schema"
	labelGroup             = "cache.kcp.io/object-group"
	labelVersion           = "cache.kcp.io/object-version"
	labelResource          = "cache.kcp.io/object-resource"
	labelOriginalName      = "cache.kcp.io/object-original-name"
	labelOriginalNamespace = "cache.kcp.io/object-original-namespace"
	labelCluster           = "cache.kcp.io/object-cluster"
	annRV                  = "cache.kcp.io/original-resource-version"
	annUID                 = "cache.kcp.io/original-uid"
	annIdentity            = "cache.kcp.io/identity-hash"
	annOriginalName        = "cache.kcp.io/original-name"
	annOriginalNamespace   = "cache.kcp.io/original-namespace"
	annOriginalCluster     = "cache.kcp.io/original-cluster"
)

var (
	cachedObjects = schema.GroupVersionResource{Group: "cache.kcp.io", Version: "v1alpha1", Resource: "cachedobjects"}
	source        = schema.GroupVersionResource{Group: "", Version: "v1", Resource: "configmaps"}
	dnsSubdomain  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabel      = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelValueRe  = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	notLabelChar  = regexp.MustCompile(`[^-A-Za-z0-9_.]`)
	notNameChar   = regexp.MustCompile(`[^-a-z0-9.]`)
	out           sync.Mutex
)

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

// -- naming (the same rules as naming.py) ------------------------------------------------------------------
func schemaOf(gvr schema.GroupVersionResource) string {
	g := gvr.Group
	if g == "" {
		g = "core"
	}
	return gvr.Version + "." + gvr.Resource + "." + g
}

// digest hashes the parts encoded as a JSON list written with ", " separators (None as null).
func digest(parts ...*string) string {
	enc := make([]string, len(parts))
	for i, p := range parts {
		if p == nil {
			enc[i] = "null"
		} else {
			b, _ := json.Marshal(*p)
			enc[i] = string(b)
		}
	}
	sum := sha256.Sum256([]byte("[" + strings.Join(enc, ", ") + "]"))
	return hex.EncodeToString(sum[:])
}

func labelValue(v string) string {
	if len(v) <= 63 && labelValueRe.MatchString(v) {
		return v
	}
	d := digest(&v)[:20]
	prefix := v
	if len(prefix) > 63-20-1 {
		prefix = prefix[:63-20-1]
	}
	prefix = strings.TrimLeft(notLabelChar.ReplaceAllString(prefix, "_"), "-_.")
	if prefix == "" {
		return d
	}
	return prefix + "-" + d
}

func wrapperName(gvr schema.GroupVersionResource, name, namespace, cluster string) string {
	s := schemaOf(gvr)
	parts := []string{}
	if cluster != "" {
		parts = append(parts, cluster)
	}
	parts = append(parts, s)
	if namespace != "" {
		parts = append(parts, namespace)
	}
	parts = append(parts, name)
	readable := strings.Join(parts, ".")
	// Reads back to the same source: the cluster does not contain the schema, the namespace is a DNS label.
	readsBack := !strings.Contains(cluster, "."+s+".") && !strings.HasPrefix(cluster+".", s+".") &&
		(namespace == "" || dnsLabel.MatchString(namespace))
	if len(readable) <= 253 && dnsSubdomain.MatchString(readable) && readsBack {
		return readable
	}
	g, v, r := gvr.Group, gvr.Version, gvr.Resource
	var ns *string
	if namespace != "" {
		ns = &namespace
	}
	d := digest(&g, &v, &r, &cluster, ns, &name)[:32]
	prefix := notNameChar.ReplaceAllString(strings.ToLower(s), "-")
	var kept []string
	for _, l := range strings.Split(prefix, ".") {
		if l = strings.Trim(l, "-"); l != "" {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, ".") + "-" + d
}

func wrapperLabels(gvr schema.GroupVersionResource, name, namespace, cluster string) map[string]string {
	g := gvr.Group
	if g == "" {
		g = "core"
	}
	return map[string]string{
		labelSchema: labelValue(schemaOf(gvr)), labelGroup: labelValue(g), labelVersion: labelValue(gvr.Version),
		labelResource: labelValue(gvr.Resource), labelOriginalName: labelValue(name),
		labelOriginalNamespace: labelValue(namespace), labelCluster: labelValue(cluster),
	}
}

func wrapperFor(gvr schema.GroupVersionResource, obj *unstructured.Unstructured, cluster, identity string) *unstructured.Unstructured {
	name, namespace := obj.GetName(), obj.GetNamespace()
	ann := map[string]string{annRV: obj.GetResourceVersion(), annUID: string(obj.GetUID()), annIdentity: identity}
	for k, v := range map[string]string{annOriginalName: name, annOriginalNamespace: namespace, annOriginalCluster: cluster} {
		if labelValue(v) != v {
			ann[k] = v
		}
	}
	raw := runtime.DeepCopyJSON(obj.Object)
	if meta, ok := raw["metadata"].(map[string]any); ok {
		delete(meta, "managedFields")
	}
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cachedObjects.GroupVersion().String(), "kind": "CachedObject",
		"spec": map[string]any{"raw": raw},
	}}
	w.SetName(wrapperName(gvr, name, namespace, cluster))
	w.SetLabels(wrapperLabels(gvr, name, namespace, cluster))
	w.SetAnnotations(ann)
	return w
}

// sourceKey is the work queue key ("namespace/name") of the source a wrapper replicates, or "" if not ours.
func sourceKey(w *unstructured.Unstructured, cluster string) string {
	l, a := w.GetLabels(), w.GetAnnotations()
	pick := func(ann, lab string) string {
		if v := a[ann]; v != "" {
			return v
		}
		return l[lab]
	}
	name, ns, c := pick(annOriginalName, labelOriginalName), pick(annOriginalNamespace, labelOriginalNamespace),
		pick(annOriginalCluster, labelCluster)
	if name == "" || c != cluster {
		return ""
	}
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// -- the replication -----------------------------------------------------------------------------------------
type replication struct {
	cluster, identity string
	selector          labels.Selector
	cacheClient       dynamic.NamespaceableResourceInterface
	sources           cache.GenericLister
	wrappers          cache.GenericLister
	queue             workqueue.TypedRateLimitingInterface[string]
}

func contains(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func (r *replication) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	var src *unstructured.Unstructured
	var got runtime.Object
	if ns != "" {
		got, err = r.sources.ByNamespace(ns).Get(name)
	} else {
		got, err = r.sources.Get(name)
	}
	if err == nil {
		src = got.(*unstructured.Unstructured)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	wname := wrapperName(source, name, ns, r.cluster)
	var wrapper *unstructured.Unstructured
	if w, err := r.wrappers.Get(wname); err == nil {
		wrapper = w.(*unstructured.Unstructured)
	}
	wanted := src != nil && r.selector.Matches(labels.Set(src.GetLabels())) &&
		!(src.GetDeletionTimestamp() != nil && len(src.GetFinalizers()) == 0)
	if !wanted {
		if wrapper != nil {
			if err := r.cacheClient.Delete(ctx, wname, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}
	desired := wrapperFor(source, src, r.cluster, r.identity)
	if wrapper == nil {
		_, err := r.cacheClient.Create(ctx, desired, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		if wrapper, err = r.cacheClient.Get(ctx, wname, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	if reflect.DeepEqual(wrapper.Object["spec"], desired.Object["spec"]) &&
		contains(wrapper.GetLabels(), desired.GetLabels()) && contains(wrapper.GetAnnotations(), desired.GetAnnotations()) {
		return nil
	}
	// The update keeps what others added to the wrapper's metadata (labels, annotations, finalizers, owners).
	desired.SetResourceVersion(wrapper.GetResourceVersion())
	mergedL := wrapper.GetLabels()
	if mergedL == nil {
		mergedL = map[string]string{}
	}
	for k, v := range desired.GetLabels() {
		mergedL[k] = v
	}
	desired.SetLabels(mergedL)
	mergedA := wrapper.GetAnnotations()
	if mergedA == nil {
		mergedA = map[string]string{}
	}
	for k, v := range desired.GetAnnotations() {
		mergedA[k] = v
	}
	desired.SetAnnotations(mergedA)
	desired.SetFinalizers(wrapper.GetFinalizers())
	desired.SetOwnerReferences(wrapper.GetOwnerReferences())
	_, err = r.cacheClient.Update(ctx, desired, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		r.queue.AddRateLimited(key) // changed or gone meanwhile: its event is on the way
		return nil
	}
	return err
}

func (r *replication) worker(ctx context.Context) {
	for {
		key, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		if err := r.sync(ctx, key); err != nil {
			r.queue.AddRateLimited(key)
		} else {
			r.queue.Forget(key)
		}
		r.queue.Done(key)
	}
}

func dropManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
	}
	return obj, nil
}

func config(path string, qps float64) *rest.Config {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		fail("kubeconfig %s: %v", path, err)
	}
	cfg.QPS = float32(qps) // negative: no client-side rate limit (our client has none)
	cfg.Burst = 1000
	return cfg
}

func main() {
	sourceKC := flag.String("source-kubeconfig", "", "kubeconfig of the source cluster")
	cacheKC := flag.String("cache-kubeconfig", "", "kubeconfig of the cache cluster")
	cluster := flag.String("cluster", "src", "the source cluster's name (in the wrapper names and labels)")
	selector := flag.String("selector", "", "label selector of the replicated sources")
	identity := flag.String("identity", "bench", "identity hash stamped on the wrappers")
	workers := flag.Int("workers", 2, "reconcile workers")
	qps := flag.Float64("qps", -1, "client QPS (negative: unlimited)")
	flag.Parse()

	sel, err := labels.Parse(*selector)
	if err != nil {
		fail("selector: %v", err)
	}
	srcDC, err := dynamic.NewForConfig(config(*sourceKC, *qps))
	if err != nil {
		fail("source client: %v", err)
	}
	cacheDC, err := dynamic.NewForConfig(config(*cacheKC, *qps))
	if err != nil {
		fail("cache client: %v", err)
	}
	emit(map[string]any{"event": "ready"})
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != "go" {
		fail("expected go on stdin, got %q", line)
	}
	emit(map[string]any{"event": "begin", "t": now()})

	ctx := context.Background()
	srcFactory := dynamicinformer.NewDynamicSharedInformerFactory(srcDC, 0)
	schemaSel := labelSchema + "=" + labelValue(schemaOf(source))
	cacheFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(cacheDC, 0, metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = schemaSel })
	srcInf := srcFactory.ForResource(source)
	wInf := cacheFactory.ForResource(cachedObjects)
	_ = srcInf.Informer().SetTransform(dropManagedFields)
	_ = wInf.Informer().SetTransform(dropManagedFields)
	r := &replication{
		cluster: *cluster, identity: *identity, selector: sel,
		cacheClient: cacheDC.Resource(cachedObjects), sources: srcInf.Lister(), wrappers: wInf.Lister(),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	mapWrapper := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if w, ok := obj.(*unstructured.Unstructured); ok {
			if key := sourceKey(w, r.cluster); key != "" {
				r.queue.Add(key)
			}
		}
	}
	srcReg, err := srcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue})
	if err != nil {
		fail("handler: %v", err)
	}
	wReg, err := wInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: mapWrapper, UpdateFunc: func(o, n any) { mapWrapper(o); mapWrapper(n) }, DeleteFunc: mapWrapper})
	if err != nil {
		fail("handler: %v", err)
	}
	stop := make(chan struct{})
	srcFactory.Start(stop)
	cacheFactory.Start(stop)
	// Writes only once both caches have synced (as ours: a restart over a replicated state writes nothing).
	if !cache.WaitForCacheSync(stop, srcReg.HasSynced, wReg.HasSynced) {
		fail("informers did not sync")
	}
	for i := 0; i < *workers; i++ {
		go r.worker(ctx)
	}
	emit(map[string]any{"event": "synced", "t": now()})
	select {}
}
