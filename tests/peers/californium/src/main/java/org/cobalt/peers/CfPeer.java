package org.cobalt.peers;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Timer;
import java.util.TimerTask;
import java.util.concurrent.atomic.AtomicLong;

import org.eclipse.californium.core.CoapClient;
import org.eclipse.californium.core.CoapHandler;
import org.eclipse.californium.core.CoapObserveRelation;
import org.eclipse.californium.core.CoapResource;
import org.eclipse.californium.core.CoapResponse;
import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.coap.BlockOption;
import org.eclipse.californium.core.coap.CoAP;
import org.eclipse.californium.core.coap.CoAP.Type;
import org.eclipse.californium.core.coap.EmptyMessage;
import org.eclipse.californium.core.coap.Message;
import org.eclipse.californium.core.coap.OptionSet;
import org.eclipse.californium.core.coap.Request;
import org.eclipse.californium.core.coap.Response;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.network.interceptors.MessageInterceptorAdapter;
import org.eclipse.californium.core.observe.ObserveRelation;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;

/**
 * Californium as an interop peer for Cobalt's tests. Every line it prints on stdout is
 * one event, {@code WORD key=value ...}, for the Rust tests to read.
 *
 * <pre>
 * CfPeer server [--block-size N] [--tick-ms N]
 *     READY port, then REQUEST/RESPONSE lines for every message, RELATIONS path n
 *     resources: /upload (PUT, POST store; GET returns), /large (5000 bytes),
 *                /obs (observable, CON notifications every --tick-ms)
 * CfPeer request METHOD URI [--non] [--accept N] [--cf N] [--payload TEXT]
 *                           [--payload-size N] [--early N] [--block-size N] [--if-none-match]
 *     SENT/RECV lines for every message, then RESPONSE and PAYLOAD
 * CfPeer observe URI --seconds N [--non] [--accept N] [--cancel proactive|reactive|none]
 *     NOTIFY lines, then CANCELLED
 * </pre>
 *
 * A payload of --payload-size N bytes is the letters a..z repeated; payloads are
 * printed with \n, \\ and non-printable bytes (\xNN) escaped.
 */
public final class CfPeer {

	private CfPeer() {
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
		System.err.println("usage: CfPeer server|request|observe ... (see the class comment)");
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

	private static boolean flag(List<String> args, String name) {
		return args.remove(name);
	}

	private static Configuration config(String blockSize) {
		Configuration config = Configuration.createStandardWithoutFile();
		config.set(CoapConfig.MAX_RESOURCE_BODY_SIZE, 1 << 20);
		if (blockSize != null) {
			int size = Integer.parseInt(blockSize);
			config.set(CoapConfig.PREFERRED_BLOCK_SIZE, size);
			config.set(CoapConfig.MAX_MESSAGE_SIZE, size);
		}
		return config;
	}

	static synchronized void emit(String line) {
		System.out.println(line);
		System.out.flush();
	}

	static String block(BlockOption b) {
		return b == null ? "-" : b.getNum() + "/" + (b.isM() ? 1 : 0) + "/" + b.getSize();
	}

	static String code(CoAP.ResponseCode c) {
		return c.codeClass + "." + String.format("%02d", c.codeDetail);
	}

	static String escape(byte[] payload) {
		StringBuilder s = new StringBuilder();
		for (byte b : payload) {
			int c = b & 0xff;
			if (c == '\\') {
				s.append("\\\\");
			} else if (c == '\n') {
				s.append("\\n");
			} else if (c >= 0x20 && c < 0x7f) {
				s.append((char) c);
			} else {
				s.append(String.format("\\x%02x", c));
			}
		}
		return s.toString();
	}

	static String describe(Message m) {
		OptionSet o = m.getOptions();
		return "type=" + m.getType() + " mid=" + m.getMID() + " block1=" + block(o.getBlock1()) + " block2="
				+ block(o.getBlock2()) + " observe=" + (o.hasObserve() ? o.getObserve() : "-") + " cf="
				+ o.getContentFormat() + " len=" + m.getPayloadSize();
	}

	static byte[] letters(int n) {
		byte[] b = new byte[n];
		for (int i = 0; i < n; i++) {
			b[i] = (byte) ('a' + i % 26);
		}
		return b;
	}

	// ------------------------------------------------------------------ server

	private static void server(List<String> args) throws Exception {
		Configuration config = config(take(args, "--block-size"));
		String tick = take(args, "--tick-ms");
		CoapEndpoint endpoint = new CoapEndpoint.Builder().setConfiguration(config)
				.setInetSocketAddress(new InetSocketAddress("127.0.0.1", 0)).build();
		endpoint.addInterceptor(new MessageInterceptorAdapter() {

			@Override
			public void receiveRequest(Request request) {
				emit("REQUEST code=" + request.getCode() + " path=/" + request.getOptions().getUriPathString() + " "
						+ describe(request));
			}

			@Override
			public void sendResponse(Response response) {
				emit("RESPONSE code=" + code(response.getCode()) + " " + describe(response));
			}
		});
		CoapServer server = new CoapServer(config);
		server.addEndpoint(endpoint);
		server.add(new Upload());
		server.add(new Large());
		Obs obs = new Obs();
		server.add(obs);
		server.start();
		new Timer("obs", true).schedule(new TimerTask() {

			@Override
			public void run() {
				obs.tick();
			}
		}, 0, tick == null ? 200 : Long.parseLong(tick));
		emit("READY " + endpoint.getAddress().getPort());
		// Runs until killed.
		Thread.currentThread().join();
	}

	/** Stores the body of a PUT or POST; GET returns it. */
	static final class Upload extends CoapResource {

		private volatile byte[] body = new byte[0];

		Upload() {
			super("upload");
		}

		@Override
		public void handleGET(CoapExchange exchange) {
			exchange.respond(CoAP.ResponseCode.CONTENT, body);
		}

		@Override
		public void handlePUT(CoapExchange exchange) {
			store(exchange);
		}

		@Override
		public void handlePOST(CoapExchange exchange) {
			store(exchange);
		}

		private void store(CoapExchange exchange) {
			body = exchange.getRequestPayload();
			emit("STORED len=" + body.length);
			exchange.respond(CoAP.ResponseCode.CHANGED, "stored " + body.length + " bytes");
		}
	}

	/** 5000 bytes of letters. */
	static final class Large extends CoapResource {

		Large() {
			super("large");
		}

		@Override
		public void handleGET(CoapExchange exchange) {
			exchange.respond(CoAP.ResponseCode.CONTENT, letters(5000));
		}
	}

	/** Observable with confirmable notifications: "tick N". */
	static final class Obs extends CoapResource {

		private final AtomicLong ticks = new AtomicLong();

		Obs() {
			super("obs");
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
			exchange.setMaxAge(2);
			exchange.respond("tick " + ticks.get());
		}

		@Override
		public void addObserveRelation(ObserveRelation relation) {
			super.addObserveRelation(relation);
			emit("RELATIONS /obs " + getObserverCount());
		}

		@Override
		public void removeObserveRelation(ObserveRelation relation) {
			super.removeObserveRelation(relation);
			emit("RELATIONS /obs " + getObserverCount());
		}
	}

	// ------------------------------------------------------------------ client

	private static CoapClient client(String uri, List<String> args) throws Exception {
		Configuration config = config(take(args, "--block-size"));
		CoapEndpoint endpoint = new CoapEndpoint.Builder().setConfiguration(config).build();
		endpoint.addInterceptor(new MessageInterceptorAdapter() {

			@Override
			public void sendRequest(Request request) {
				emit("SENT code=" + request.getCode() + " " + describe(request));
			}

			@Override
			public void receiveResponse(Response response) {
				emit("RECV code=" + code(response.getCode()) + " " + describe(response));
			}

			@Override
			public void sendEmptyMessage(EmptyMessage message) {
				emit("SENT code=0.00 " + describe(message));
			}
		});
		endpoint.start();
		CoapClient client = new CoapClient(uri);
		client.setEndpoint(endpoint);
		client.setTimeout(15_000L);
		String early = take(args, "--early");
		if (early != null) {
			client.useEarlyNegotiation(Integer.parseInt(early));
		}
		return client;
	}

	private static Request build(CoAP.Code method, List<String> args) {
		Request request = new Request(method, flag(args, "--non") ? Type.NON : Type.CON);
		String accept = take(args, "--accept");
		if (accept != null) {
			request.getOptions().setAccept(Integer.parseInt(accept));
		}
		String cf = take(args, "--cf");
		if (cf != null) {
			request.getOptions().setContentFormat(Integer.parseInt(cf));
		}
		String text = take(args, "--payload");
		if (text != null) {
			request.setPayload(text.getBytes(StandardCharsets.UTF_8));
		}
		String size = take(args, "--payload-size");
		if (size != null) {
			request.setPayload(letters(Integer.parseInt(size)));
		}
		if (flag(args, "--if-none-match")) {
			request.getOptions().setIfNoneMatch(true);
		}
		return request;
	}

	private static void request(List<String> args) throws Exception {
		CoAP.Code method = CoAP.Code.valueOf(args.remove(0));
		String uri = args.remove(0);
		CoapClient client = client(uri, args);
		Request request = build(method, args);
		CoapResponse response = client.advanced(request);
		if (response == null) {
			emit("ERROR no response (timeout)");
			System.exit(1);
		}
		emit("RESPONSE code=" + code(response.getCode()) + " " + describe(response.advanced()));
		emit("PAYLOAD " + escape(response.getPayload()));
		System.exit(0);
	}

	private static void observe(List<String> args) throws Exception {
		String uri = args.remove(0);
		long seconds = Long.parseLong(take(args, "--seconds"));
		String cancel = take(args, "--cancel");
		CoapClient client = client(uri, args);
		Request request = build(CoAP.Code.GET, args);
		request.setObserve();
		CoapObserveRelation relation = client.observe(request, new CoapHandler() {

			@Override
			public void onLoad(CoapResponse response) {
				Response r = response.advanced();
				emit("NOTIFY code=" + code(r.getCode()) + " " + describe(r) + " payload="
						+ escape(r.getPayload()));
			}

			@Override
			public void onError() {
				emit("ERROR observation failed");
			}
		});
		Thread.sleep(seconds * 1000);
		if ("proactive".equals(cancel)) {
			relation.proactiveCancel();
		} else if ("reactive".equals(cancel)) {
			relation.reactiveCancel();
		}
		Thread.sleep(1500);
		emit("CANCELLED " + (cancel == null ? "none" : cancel));
		System.exit(0);
	}
}
