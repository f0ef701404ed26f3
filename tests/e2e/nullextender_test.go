package e2e

// The null extender: the least any extender can cost. It passes every candidate kube-scheduler
// sends (filter) and binds with a bare Binding (bind), deciding nothing. With
// DNE_E2E_BENCH_NULL=1 the throughput bench adds "(n) null extender" cases beside (b) and (c):
// the same stanza pointed at this server instead of the extender. Its ratio to (a) is the
// ceiling the extender protocol itself leaves on this machine (kube-scheduler encoding the pod
// and every candidate's name, decoding the answer, its extender bookkeeping, one more HTTP hop
// per bind), whatever the extender does; (b) against (n) is what this project's work costs on
// top. It is its own process (this test binary, re-executed: see TestMain), as the extender
// is, so it never waits behind the API server's goroutines; its CPU is the "extender" column
// of its rows. A bench aid, never asserted.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

const (
	nullExtenderListenEnv     = "DNE_E2E_NULL_EXTENDER_LISTEN"
	nullExtenderKubeconfigEnv = "DNE_E2E_NULL_EXTENDER_KUBECONFIG"
)

type nullExtender struct {
	proc *childProc
	url  string
}

// startNullExtender runs the null extender as a child process and waits until it answers.
func (cp *controlPlane) startNullExtender() *nullExtender {
	t := cp.t
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), nullExtenderListenEnv+"="+addr, nullExtenderKubeconfigEnv+"="+cp.adminKubeconfig)
	n := &nullExtender{
		proc: startChild(t, "null extender", cmd, filepath.Join(cp.dir, fmt.Sprintf("null-extender-%d.log", time.Now().UnixNano())), 20),
		url:  "http://" + addr,
	}
	err = wait.PollUntilContextTimeout(cp.ctx, 50*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		resp, err := http.Get(n.url + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("the null extender never answered: %v", err)
	}
	return n
}

func (n *nullExtender) stop() { n.proc.kill() }

// runNullExtender serves the null extender on addr until killed (TestMain calls it when
// nullExtenderListenEnv is set). Its client binds as kube-scheduler's default binder does:
// protobuf, no client-side rate limit to speak of.
func runNullExtender(addr, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
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
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		err := client.CoreV1().Pods(args.PodNamespace).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
		}, metav1.CreateOptions{})
		result := extenderv1.ExtenderBindingResult{}
		if err != nil {
			result.Error = err.Error()
		}
		writeJSON(w, result)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
