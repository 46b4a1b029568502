// Command example is a tiny Go client of Fortis, built from code that `buf generate`
// writes from protos/buf.gen.yaml (see ../README.md). It lists the targets the API key's
// tenant may query and, given -plan, validates a test plan, printing each field violation
// of the google.rpc.BadRequest detail of a refused plan.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	evaluationv1 "github.com/fortis-robustness/fortis/gen/go/fortis/evaluation/v1"
	proxyv1 "github.com/fortis-robustness/fortis/gen/go/fortis/proxy/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func main() {
	address := flag.String("address", "127.0.0.1:50051", "host:port of the Fortis services")
	apiKey := flag.String("api-key", os.Getenv("FORTIS_API_KEY"), "API key (x-api-key metadata)")
	plan := flag.String("plan", "", "test plan text (YAML or JSON) to validate")
	flag.Parse()

	dialCtx, cancelDial := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelDial()
	// grpc.WithInsecure: Debian's grpc-go 1.33 predates insecure.NewCredentials.
	conn, err := grpc.DialContext(dialCtx, *address, grpc.WithInsecure(), grpc.WithBlock())
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", *address, err)
		os.Exit(1)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", *apiKey)

	targets, err := proxyv1.NewTargetProxyServiceClient(conn).ListTargets(
		ctx, &proxyv1.ListTargetsRequest{PageSize: 100})
	if err != nil {
		fmt.Fprintf(os.Stderr, "ListTargets: %v\n", status.Convert(err).Message())
		os.Exit(1)
	}
	for _, t := range targets.GetTargets() {
		fmt.Printf("target %s\n", t.GetName())
	}

	if *plan == "" {
		return
	}
	resp, err := evaluationv1.NewEvaluationServiceClient(conn).ValidatePlan(
		ctx, &evaluationv1.ValidatePlanRequest{Plan: *plan})
	if err != nil {
		st := status.Convert(err)
		fmt.Printf("invalid plan: %s\n", st.Code())
		for _, detail := range st.Details() {
			if br, ok := detail.(*errdetails.BadRequest); ok {
				for _, v := range br.GetFieldViolations() {
					fmt.Printf("violation %s: %s\n", v.GetField(), v.GetDescription())
				}
			}
		}
		os.Exit(3)
	}
	fmt.Printf("valid plan %s: %d corruptions, %d attacks\n",
		resp.GetPlanName(), resp.GetCorruptions(), resp.GetAttacks())
}
