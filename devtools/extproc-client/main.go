// extproc-client plays Envoy's part against an ext_proc endpoint picker, with Envoy's own generated
// types (go-control-plane): it opens ExternalProcessor/Process, sends one request's headers and body
// (buffered, or full-duplex streamed as the upstream EPP runs), reads the picker's answers, and
// optionally sends the request to the endpoint picked, as Envoy would, then reports the response
// phases (with x-gateway-destination-endpoint-served in the envoy.lb metadata). It prints one JSON
// object. No Envoy binary is installable on the project's machines; this stands in for one.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

const destination = "x-gateway-destination-endpoint"

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ",") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

type result struct {
	Phases           []string          `json:"phases"`
	HeaderEndpoint   string            `json:"header_endpoint,omitempty"`
	MetadataEndpoint string            `json:"metadata_endpoint,omitempty"`
	ClearRouteCache  bool              `json:"clear_route_cache,omitempty"`
	BodyForwarded    *int              `json:"body_forwarded,omitempty"`
	ImmediateStatus  int               `json:"immediate_status,omitempty"`
	ImmediateBody    string            `json:"immediate_body,omitempty"`
	ImmediateDetails string            `json:"immediate_details,omitempty"`
	HTTPStatus       int               `json:"http_status,omitempty"`
	HTTPHeaders      map[string]string `json:"http_headers,omitempty"`
	HTTPBody         string            `json:"http_body,omitempty"`
	Health           string            `json:"health,omitempty"`
	Error            string            `json:"error,omitempty"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9004", "the picker's ext_proc address")
	method := flag.String("method", "POST", "HTTP method")
	path := flag.String("path", "/v1/messages", "HTTP path")
	authority := flag.String("authority", "gateway.local", ":authority")
	bodyFile := flag.String("body-file", "", "request body file (empty: no body, headers end the stream)")
	mode := flag.String("mode", "buffered", "request body mode: buffered or duplex (FULL_DUPLEX_STREAMED)")
	send := flag.Bool("send", false, "send the request to the picked endpoint and report the response phases")
	health := flag.String("health", "", "only call grpc.health.v1.Health/Check for this service")
	subset := flag.String("subset", "", "comma-separated ip:port list sent as envoy.lb.subset_hint (empty: none)")
	timeout := flag.Duration("timeout", 20*time.Second, "overall deadline")
	var headers headerFlags
	flag.Var(&headers, "header", "request header name:value (repeatable)")
	flag.Parse()

	out := result{Phases: []string{}}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err := run(ctx, &out, options{*addr, *method, *path, *authority, *bodyFile, *mode, *send, *health, *subset, headers})
	if err != nil {
		out.Error = err.Error()
	}
	enc := json.NewEncoder(os.Stdout)
	_ = enc.Encode(out)
	if err != nil {
		os.Exit(1)
	}
}

type options struct {
	addr, method, path, authority, bodyFile, mode string
	send                                          bool
	health, subset                                string
	headers                                       []string
}

func run(ctx context.Context, out *result, o options) error {
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	if o.health != "" || o.mode == "health" {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: o.health})
		if err != nil {
			return err
		}
		out.Health = resp.GetStatus().String()
		return nil
	}
	var body []byte
	if o.bodyFile != "" {
		if body, err = os.ReadFile(o.bodyFile); err != nil {
			return err
		}
	}
	reqHeaders := [][2]string{{":method", o.method}, {":path", o.path}, {":authority", o.authority}, {":scheme", "http"}}
	for _, h := range o.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return fmt.Errorf("header %q: want name:value", h)
		}
		reqHeaders = append(reqHeaders, [2]string{strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(value)})
	}
	bodyMode := filterv3.ProcessingMode_BUFFERED
	if o.mode == "duplex" {
		bodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return err
	}
	// Envoy sends the protocol configuration on the stream's first message.
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(reqHeaders), EndOfStream: len(body) == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: bodyMode, ResponseBodyMode: filterv3.ProcessingMode_NONE},
	}
	if o.subset != "" {
		// The data plane's endpoint subset rides in the request's filter metadata.
		var list []any
		for _, e := range strings.Split(o.subset, ",") {
			list = append(list, e)
		}
		hint, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-subset": list})
		if err != nil {
			return err
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb.subset_hint": hint}}
	}
	if err := stream.Send(first); err != nil {
		return err
	}
	apply := func(resp *extprocv3.ProcessingResponse) (done bool) {
		if md := resp.GetDynamicMetadata(); md != nil {
			if lb := md.GetFields()["envoy.lb"].GetStructValue(); lb != nil {
				out.MetadataEndpoint = lb.GetFields()[destination].GetStringValue()
			}
		}
		if imm := resp.GetImmediateResponse(); imm != nil {
			out.Phases = append(out.Phases, "immediate_response")
			out.ImmediateStatus = int(imm.GetStatus().GetCode())
			out.ImmediateBody = string(imm.GetBody())
			out.ImmediateDetails = imm.GetDetails()
			return true
		}
		var common *extprocv3.CommonResponse
		switch r := resp.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			out.Phases = append(out.Phases, "request_headers")
			common = r.RequestHeaders.GetResponse()
		case *extprocv3.ProcessingResponse_RequestBody:
			out.Phases = append(out.Phases, "request_body")
			common = r.RequestBody.GetResponse()
			if s := common.GetBodyMutation().GetStreamedResponse(); s != nil {
				n := len(s.GetBody())
				if out.BodyForwarded != nil {
					n += *out.BodyForwarded
				}
				out.BodyForwarded = &n
			}
		default:
			out.Phases = append(out.Phases, fmt.Sprintf("unexpected %T", r))
		}
		if common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
			out.Phases = append(out.Phases, "status "+common.GetStatus().String())
		}
		out.ClearRouteCache = out.ClearRouteCache || common.GetClearRouteCache()
		for _, set := range common.GetHeaderMutation().GetSetHeaders() {
			h := set.GetHeader()
			value := h.GetValue()
			if len(h.GetRawValue()) > 0 {
				value = string(h.GetRawValue())
			}
			if strings.EqualFold(h.GetKey(), destination) {
				out.HeaderEndpoint = value
			}
		}
		return false
	}
	recv := func() (*extprocv3.ProcessingResponse, error) { return stream.Recv() }

	if len(body) == 0 {
		resp, err := recv()
		if err != nil {
			return err
		}
		if apply(resp) {
			return stream.CloseSend()
		}
	} else if bodyMode == filterv3.ProcessingMode_BUFFERED {
		resp, err := recv()
		if err != nil {
			return err
		}
		if apply(resp) {
			return stream.CloseSend()
		}
		body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
		if err := stream.Send(body); err != nil {
			return err
		}
		if resp, err = recv(); err != nil {
			return err
		}
		if apply(resp) {
			return stream.CloseSend()
		}
	} else {
		// Full duplex: the body goes in two chunks without waiting; the picker answers the headers
		// once the body has ended, then sends the body on.
		half := len(body) / 2
		for i, chunk := range [][]byte{body[:half], body[half:]} {
			msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: i == 1}}}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		for out.BodyForwarded == nil || *out.BodyForwarded < len(body) {
			resp, err := recv()
			if err != nil {
				return err
			}
			if apply(resp) {
				return stream.CloseSend()
			}
		}
	}
	if o.send && out.HeaderEndpoint != "" {
		if err := forward(ctx, out, o, reqHeaders, body, stream); err != nil {
			return err
		}
	}
	return stream.CloseSend()
}

// forward sends the request where the picker said (as Envoy's original-destination cluster does)
// and reports the response headers with the served endpoint in envoy.lb metadata.
func forward(ctx context.Context, out *result, o options, reqHeaders [][2]string, body []byte, stream extprocv3.ExternalProcessor_ProcessClient) error {
	req, err := http.NewRequestWithContext(ctx, o.method, "http://"+out.HeaderEndpoint+o.path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range reqHeaders {
		if !strings.HasPrefix(h[0], ":") {
			req.Header.Set(h[0], h[1])
		}
	}
	req.Header.Set(destination, out.HeaderEndpoint)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	out.HTTPStatus = resp.StatusCode
	out.HTTPHeaders = map[string]string{}
	respHeaders := [][2]string{{":status", fmt.Sprint(resp.StatusCode)}}
	for name := range resp.Header {
		out.HTTPHeaders[strings.ToLower(name)] = resp.Header.Get(name)
		respHeaders = append(respHeaders, [2]string{strings.ToLower(name), resp.Header.Get(name)})
	}
	if len(data) > 4096 {
		data = data[:4096]
	}
	out.HTTPBody = string(data)
	served, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-served": out.HeaderEndpoint})
	if err != nil {
		return err
	}
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(respHeaders), EndOfStream: true}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": served}},
	}
	if err := stream.Send(msg); err != nil {
		return err
	}
	r, err := stream.Recv()
	if err != nil {
		return err
	}
	if r.GetResponseHeaders() == nil {
		return fmt.Errorf("response headers answered with %T", r.GetResponse())
	}
	out.Phases = append(out.Phases, "response_headers")
	return nil
}

// headerMap is how Envoy sends headers: raw_value set, value empty.
func headerMap(pairs [][2]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, p := range pairs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: p[0], RawValue: []byte(p[1])})
	}
	return m
}
