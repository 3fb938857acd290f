package org.cobalt.peers;

import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Timer;
import java.util.TimerTask;
import java.util.concurrent.atomic.AtomicLong;

import org.eclipse.californium.core.CoapClient;
import org.eclipse.californium.core.CoapHandler;
import org.eclipse.californium.core.CoapResource;
import org.eclipse.californium.core.CoapResponse;
import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.coap.CoAP;
import org.eclipse.californium.core.coap.CoAP.Type;
import org.eclipse.californium.core.coap.Request;
import org.eclipse.californium.core.coap.Response;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.network.interceptors.MessageInterceptorAdapter;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.cose.AlgorithmID;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;
import org.eclipse.californium.elements.util.Bytes;
import org.eclipse.californium.oscore.HashMapCtxDB;
import org.eclipse.californium.oscore.OSCoreCoapStackFactory;
import org.eclipse.californium.oscore.OSCoreCtx;

/**
 * Californium's OSCORE (cf-oscore) as an interop peer for Cobalt's tests, with one
 * security context from arguments. Every line it prints on stdout is one event, as
 * {@link CfPeer}'s are.
 *
 * <pre>
 * context: --secret HEX --sender HEX --recipient HEX [--salt HEX] [--id-context HEX]
 *          [--first-seq N] (IDs may be empty: --sender ""; a client that is run again
 *          with the same context needs a --first-seq past the numbers it used: this
 *          peer does not persist its sequence number)
 * OscorePeer server CONTEXT [--port N] [--quiet]
 *     READY port, then REQUEST lines (outer messages: oscore=1 when protected), none
 *     with --quiet (bench/oscore.sh); on 127.0.0.1, port N or a free one
 *     resources: /hello (GET "hello from californium"), /echo (POST: the payload, 2.04),
 *                /large (3000 bytes of letters), /counter (observable, "count N" every 200 ms),
 *                /benchmark (GET "hello world", as Cobalt's and bench/servers' answer)
 * OscorePeer request METHOD URI CONTEXT [--payload TEXT]
 *     RESPONSE code=C.DD len=N, then PAYLOAD text (escaped as CfPeer escapes)
 * OscorePeer observe URI CONTEXT --count N
 *     NOTIFY code=C.DD payload=... for the first N notifications, then DONE
 * </pre>
 */
public final class OscorePeer {

	private OscorePeer() {
	}

	static {
		CoapConfig.register();
		UdpConfig.register();
	}

	public static void main(String[] args) throws Exception {
		if (args.length == 0) {
			usage();
		}
		List<String> rest = new ArrayList<>(Arrays.asList(args).subList(1, args.length));
		switch (args[0]) {
		case "server":
			server(rest);
			break;
		case "request":
			request(rest);
			break;
		case "observe":
			observe(rest);
			break;
		default:
			usage();
		}
	}

	private static void usage() {
		System.err.println("usage: OscorePeer server|request|observe ... (see the class comment)");
		System.exit(2);
	}

	/** The value after {@code name} in {@code args}, removing both; {@code null} if absent. */
	private static String take(List<String> args, String name) {
		int i = args.indexOf(name);
		if (i < 0 || i + 1 >= args.size()) {
			return null;
		}
		String v = args.get(i + 1);
		args.remove(i + 1);
		args.remove(i);
		return v;
	}

	private static byte[] hex(String s) {
		if (s == null) {
			return null;
		}
		byte[] out = new byte[s.length() / 2];
		for (int i = 0; i < out.length; i++) {
			out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
		}
		return out;
	}

	/** The security context the arguments describe (AES-CCM-16-64-128, HKDF-SHA256, window 32). */
	private static OSCoreCtx context(List<String> args, boolean client) throws Exception {
		byte[] secret = hex(take(args, "--secret"));
		byte[] sender = hex(take(args, "--sender"));
		byte[] recipient = hex(take(args, "--recipient"));
		byte[] salt = hex(take(args, "--salt"));
		byte[] idContext = hex(take(args, "--id-context"));
		String firstSeq = take(args, "--first-seq");
		if (secret == null || sender == null || recipient == null) {
			System.err.println("--secret, --sender and --recipient are required");
			System.exit(2);
		}
		OSCoreCtx context = new OSCoreCtx(secret, client, AlgorithmID.AES_CCM_16_64_128, sender, recipient,
				AlgorithmID.HKDF_HMAC_SHA_256, 32, salt, idContext, 1024);
		if (firstSeq != null) {
			context.setSenderSeq(Integer.parseInt(firstSeq));
		}
		return context;
	}

	private static Configuration config() {
		Configuration config = Configuration.createStandardWithoutFile();
		config.set(CoapConfig.MAX_RESOURCE_BODY_SIZE, 1 << 20);
		return config;
	}

	private static CoapEndpoint endpoint(HashMapCtxDB db, InetSocketAddress bind) {
		CoapEndpoint.Builder builder = new CoapEndpoint.Builder().setConfiguration(config())
				.setCoapStackFactory(new OSCoreCoapStackFactory()).setCustomCoapStackArgument(db);
		if (bind != null) {
			builder.setInetSocketAddress(bind);
		}
		return builder.build();
	}

	// ------------------------------------------------------------------ server

	private static void server(List<String> args) throws Exception {
		String port = take(args, "--port");
		boolean quiet = args.remove("--quiet");
		HashMapCtxDB db = new HashMapCtxDB();
		db.addContext(context(args, false));
		CoapEndpoint endpoint = endpoint(db,
				new InetSocketAddress("127.0.0.1", port == null ? 0 : Integer.parseInt(port)));
		if (!quiet) {
			endpoint.addInterceptor(new MessageInterceptorAdapter() {

				@Override
				public void receiveRequest(Request request) {
					CfPeer.emit("REQUEST code=" + request.getCode() + " oscore="
							+ (request.getOptions().hasOscore() ? 1 : 0) + " len=" + request.getPayloadSize());
				}

				@Override
				public void sendResponse(Response response) {
					CfPeer.emit("RESPONSE code=" + CfPeer.code(response.getCode()) + " oscore="
							+ (response.getOptions().hasOscore() ? 1 : 0) + " payload="
							+ CfPeer.escape(response.getPayload()));
				}
			});
		}
		CoapServer server = new CoapServer(config());
		server.addEndpoint(endpoint);
		server.add(new Text("hello", "hello from californium"));
		server.add(new Echo());
		server.add(new Text("large", new String(CfPeer.letters(3000), StandardCharsets.US_ASCII)));
		server.add(new Text("benchmark", "hello world"));
		Counter counter = new Counter();
		server.add(counter);
		server.start();
		new Timer("counter", true).schedule(new TimerTask() {

			@Override
			public void run() {
				counter.tick();
			}
		}, 200, 200);
		CfPeer.emit("READY " + endpoint.getAddress().getPort());
		// Runs until killed.
		Thread.currentThread().join();
	}

	/** GET answers a fixed text. */
	static final class Text extends CoapResource {

		private final String text;

		Text(String name, String text) {
			super(name);
			this.text = text;
		}

		@Override
		public void handleGET(CoapExchange exchange) {
			exchange.respond(CoAP.ResponseCode.CONTENT, text);
		}
	}

	/** POST answers 2.04 with the request's payload. */
	static final class Echo extends CoapResource {

		Echo() {
			super("echo");
		}

		@Override
		public void handlePOST(CoapExchange exchange) {
			exchange.respond(CoAP.ResponseCode.CHANGED, exchange.getRequestPayload());
		}
	}

	/** Observable: "count N", N one more every tick. */
	static final class Counter extends CoapResource {

		private final AtomicLong ticks = new AtomicLong();

		Counter() {
			super("counter");
			setObservable(true);
			setObserveType(Type.CON);
			getAttributes().setObservable();
		}

		void tick() {
			ticks.incrementAndGet();
			changed();
		}

		@Override
		public void handleGET(CoapExchange exchange) {
			exchange.respond("count " + ticks.get());
		}
	}

	// ------------------------------------------------------------------ client

	private static CoapClient client(String uri, List<String> args) throws Exception {
		HashMapCtxDB db = new HashMapCtxDB();
		URI parsed = new URI(uri);
		db.addContext(parsed.getScheme() + "://" + parsed.getAuthority(), context(args, true));
		CoapEndpoint endpoint = endpoint(db, null);
		endpoint.start();
		CoapClient client = new CoapClient(uri);
		client.setEndpoint(endpoint);
		client.setTimeout(15_000L);
		return client;
	}

	private static void request(List<String> args) throws Exception {
		CoAP.Code method = CoAP.Code.valueOf(args.remove(0));
		String uri = args.remove(0);
		String payload = take(args, "--payload");
		CoapClient client = client(uri, args);
		Request request = new Request(method, Type.CON);
		request.getOptions().setOscore(Bytes.EMPTY);
		if (payload != null) {
			request.setPayload(payload.getBytes(StandardCharsets.UTF_8));
		}
		CoapResponse response;
		try {
			response = client.advanced(request);
		} catch (Exception e) {
			CfPeer.emit("ERROR " + e.getClass().getSimpleName() + ": " + e.getMessage());
			System.exit(1);
			return;
		}
		if (response == null) {
			CfPeer.emit("ERROR no response (timeout or rejected)");
			System.exit(1);
		}
		CfPeer.emit("RESPONSE code=" + CfPeer.code(response.getCode()) + " len=" + response.getPayload().length);
		CfPeer.emit("PAYLOAD " + CfPeer.escape(response.getPayload()));
		System.exit(0);
	}

	private static void observe(List<String> args) throws Exception {
		String uri = args.remove(0);
		int count = Integer.parseInt(take(args, "--count"));
		CoapClient client = client(uri, args);
		Request request = new Request(CoAP.Code.GET, Type.CON);
		request.getOptions().setOscore(Bytes.EMPTY);
		request.setObserve();
		java.util.concurrent.CountDownLatch seen = new java.util.concurrent.CountDownLatch(count);
		client.observe(request, new CoapHandler() {

			@Override
			public void onLoad(CoapResponse response) {
				if (seen.getCount() > 0) {
					CfPeer.emit("NOTIFY code=" + CfPeer.code(response.getCode()) + " payload="
							+ CfPeer.escape(response.getPayload()));
				}
				seen.countDown();
			}

			@Override
			public void onError() {
				CfPeer.emit("ERROR observation failed");
			}
		});
		boolean all = seen.await(20, java.util.concurrent.TimeUnit.SECONDS);
		CfPeer.emit(all ? "DONE" : "ERROR fewer notifications than asked for");
		System.exit(all ? 0 : 1);
	}
}
