package e2e

// A TCP forwarder that gives kube-apiserver one address for the whole test: the test server
// picks a fresh port on every start, and a restart must look to clients like the same server
// going away and coming back. TLS passes through untouched.

import (
	"io"
	"net"
	"sync"
	"testing"
)

type apiProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string // "" while the apiserver is down: connections are closed at once
	conns  map[net.Conn]struct{}
	// detach: a client that goes away (a SIGKILLed extender) leaves its connection to the
	// apiserver open until the apiserver answers, as a request still in the network, a slow
	// etcd or an admission webhook would: the apiserver does not see the client leave, so it
	// does not cancel what the client sent.
	detach bool
}

// setDetach turns detach on or off for clients that go away from now on.
func (p *apiProxy) setDetach(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.detach = on
}

func newAPIProxy(t *testing.T) *apiProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.retarget("")
	})
	return p
}

func (p *apiProxy) addr() string { return p.ln.Addr().String() }

// retarget points new connections at target and closes every forwarded connection, as a
// stopped server would.
func (p *apiProxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

func (p *apiProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(client)
	}
}

func (p *apiProxy) forward(client net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	if target == "" {
		client.Close()
		return
	}
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.target != target {
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	up, down := make(chan struct{}), make(chan struct{})
	go func() { _, _ = io.Copy(server, client); close(up) }()
	go func() { _, _ = io.Copy(client, server); close(down) }()
	select {
	case <-up:
		p.mu.Lock()
		detach := p.detach
		p.mu.Unlock()
		if detach {
			// The client is gone; the apiserver's answer (when it comes) fails to reach it.
			<-down
		}
	case <-down:
	}
	client.Close()
	server.Close()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
