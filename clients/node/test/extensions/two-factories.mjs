// A file that offers two factories (registered whole, each is registered).
import { defineFactory, joinSession } from "@factory/client";

const first = defineFactory({
    meta: { name: "first-of-two", description: "" },
    run: async () => ({ which: "first" }),
});

const second = defineFactory({
    meta: { name: "second-of-two", description: "" },
    run: async () => ({ which: "second" }),
});

await joinSession({ factories: [first, second] });
