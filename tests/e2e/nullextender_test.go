package e2e

// The null extender: the least any extender can cost. It passes every candidate kube-scheduler
// sends (filter) and binds with a bare Binding (bind), deciding nothing. With
// DNE_E2E_BENCH_NULL=1 the throughput bench adds the case "(n) null extender" beside (b):
// the chart's stanza pointed at this server instead of the extender. Its ratio to (a) is the
// ceiling the extender protocol itself leaves on this machine (kube-scheduler encoding the pod
// and every candidate's name, decoding the answer, its extender bookkeeping), whatever the
// extender does; (b) against (n) is what this project's work costs on top. It runs in the test
// process, so its CPU counts as the control plane's. A bench aid, never asserted.

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

type nullExtender struct {
	srv *http.Server
	url string
}

func (cp *controlPlane) startNullExtender() *nullExtender {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cp.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/filter", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, extenderv1.ExtenderFilterResult{
			NodeNames:                  args.NodeNames,
			FailedNodes:                extenderv1.FailedNodesMap{},
			FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
		})
	})
	mux.HandleFunc("/bind", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderBindingArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(cp.ctx, 30*time.Second)
		defer cancel()
		err := cp.admin.CoreV1().Pods(args.PodNamespace).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
		}, metav1.CreateOptions{})
		result := extenderv1.ExtenderBindingResult{}
		if err != nil {
			result.Error = err.Error()
		}
		writeJSON(w, result)
	})
	n := &nullExtender{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, url: "http://" + l.Addr().String()}
	go func() { _ = n.srv.Serve(l) }()
	return n
}

func (n *nullExtender) stop() { _ = n.srv.Close() }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
