import asyncio

from .app import main

asyncio.run(main())
