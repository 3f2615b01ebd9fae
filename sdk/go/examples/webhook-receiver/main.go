// Command webhook-receiver subscribes a local URL to every event type,
// serves it with ratchet.WebhookHandler (each delivery verified), prints the
// events it receives, and removes the subscription on Ctrl-C. The local
// server must be allowed to call a loopback address:
//
//	WEBHOOK_ALLOW_PRIVATE_NETWORKS=true scripts/dev      # in the repository root
//	RATCHET_OPERATOR_KEY=... go run ./examples/webhook-receiver
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	apiKey, err := keyFrom("RATCHET_OPERATOR_KEY")
	if err != nil {
		return err
	}
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: envOr("RATCHET_BASE_URL", "http://localhost:8787"),
		APIKey:  apiKey, // a key with webhooks:write; never in source
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", envOr("LISTEN", "127.0.0.1:8790"))
	if err != nil {
		return err
	}
	hook, err := client.CreateWebhook(ctx, "http://"+ln.Addr().String()+"/ratchet", []string{
		ratchet.EventEffectIndeterminate, ratchet.EventCircuitTripped, ratchet.EventCircuitClosed,
		ratchet.EventApprovalRequested, ratchet.EventApprovalDecided, ratchet.EventReconciliationDue,
		ratchet.EventRunFinished, ratchet.EventStepExhausted, ratchet.EventStepReplayed,
	})
	if err != nil {
		ln.Close()
		return err
	}
	log.Printf("subscribed %s as %s; events arrive at the sweeper's pace (5 s locally)", hook.URL, hook.ID)

	var (
		mu   sync.Mutex
		seen = map[string]bool{} // delivery is at least once: by event id
	)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second,
		Handler: ratchet.WebhookHandler(hook.Secret, func(_ context.Context, ev *ratchet.WebhookEvent) error {
			mu.Lock()
			defer mu.Unlock()
			if !seen[ev.ID] {
				seen[ev.ID] = true
				log.Printf("%s %s about %s: %s", ev.CreatedAt.Format(time.RFC3339), ev.Type, ev.SubjectID, ev.Data)
			}
			return nil
		})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case <-ctx.Done():
	case err = <-served:
	}
	// Clean up with a context of its own: ctx has ended.
	done, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(done)
	if _, derr := client.DeleteWebhook(done, hook.ID); derr != nil {
		return errors.Join(err, derr)
	}
	log.Printf("unsubscribed %s", hook.ID)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// keyFrom reads the API key from the environment variable name, saying which
// variable is unset rather than only that a key is missing.
func keyFrom(name string) (string, error) {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s is not set: export the key's secret in this shell (see sdk/go/README.md's quickstart)", name)
}
